"""TimmClassifier, its preprocessor, the classification datasets and the accuracy metric."""
from __future__ import annotations

import pickle

import cv2
import numpy as np
import pytest
import timm
import torch
from mmengine.dataset import Compose
from mmengine.structures import BaseDataElement

import mmdropit  # noqa: F401
from mmdropit.engine.classification import (CIFAR100Dataset, ImageFolderDataset, MNIST5kDataset,
                                      PackClsInputs)
from mmdropit.engine.classification import TopKAccuracy
from mmdropit.engine.classification import TimmClassifier
from mmdropit.errors import ConfigError, DataFormatError, DataNotFoundError


def _classifier(**kwargs) -> TimmClassifier:
    defaults = dict(model_name='vit_tiny_patch16_224', num_classes=10, img_size=28, patch_size=7,
                    in_chans=1, embed_dim=32, depth=1, num_heads=2,
                    data_preprocessor=dict(type='ClsDataPreprocessor', mean=[33.3], std=[78.6]))
    return TimmClassifier(**dict(defaults, **kwargs))


def _batch(n: int = 4) -> dict:
    dataset = MNIST5kDataset(split='test', indices=n, pipeline=[dict(type='PackClsInputs')])
    items = [dataset[i] for i in range(n)]
    return dict(inputs=[item['inputs'] for item in items],
                data_samples=[item['data_samples'] for item in items])


def test_loss_matches_cross_entropy_with_label_smoothing():
    torch.manual_seed(0)
    model = _classifier(label_smoothing=0.1)
    data = model.data_preprocessor(_batch(), training=True)
    loss = model(**data, mode='loss')['loss']
    logits = model(data['inputs'], mode='tensor')
    labels = torch.cat([s.gt_label for s in data['data_samples']])
    expected = torch.nn.functional.cross_entropy(logits, labels, label_smoothing=0.1)
    torch.testing.assert_close(loss, expected)
    assert not torch.allclose(loss, torch.nn.functional.cross_entropy(logits, labels))


def test_predict_gives_scores_and_labels():
    model = _classifier().eval()
    samples = model.val_step(_batch())
    assert len(samples) == 4
    for sample in samples:
        assert sample.pred_score.shape == (10,)
        torch.testing.assert_close(sample.pred_score.sum(), torch.tensor(1.0))
        assert int(sample.pred_label) == int(sample.pred_score.argmax())


def test_state_dict_keys_are_the_timm_keys_under_model():
    model = _classifier()
    timm_keys = set(model.model.state_dict())
    assert {k for k in model.state_dict() if not k.startswith('data_preprocessor')} == {
        f'model.{key}' for key in timm_keys}


def test_pretrained_file_is_loaded_and_kept_by_init_weights(tmp_path):
    source = timm.create_model('resnet18', num_classes=7)
    path = tmp_path / 'resnet18.pth'
    torch.save(source.state_dict(), path)
    model = TimmClassifier('resnet18', num_classes=3, pretrained_file=str(path))
    model.init_weights()  # what the Runner calls; must not re-draw the weights
    torch.testing.assert_close(model.model.conv1.weight, source.conv1.weight)
    assert model.model.fc.out_features == 3


def test_init_cfg_is_applied_once():
    model = TimmClassifier('resnet18', num_classes=3,
                           init_cfg=dict(type='Constant', layer='Linear', val=0.5))
    model.init_weights()
    assert torch.all(model.model.fc.weight == 0.5)
    with torch.no_grad():
        model.model.fc.weight.fill_(2.0)  # trained (or sharded) since
    model.init_weights()  # the runner's call after an FSDP wrapper's: must not initialise again
    assert torch.all(model.model.fc.weight == 2.0)


def test_grad_checkpointing_checkpoints_each_block_and_keeps_the_gradients():
    """``grad_checkpointing=True`` is timm's ``set_grad_checkpointing()`` (the simple recipe's
    per-block checkpointing), with DropIT's layers inside: the same gradients."""
    from mmdropit.dropit import to_dropit

    grads = []
    for checkpointed in (False, True):
        torch.manual_seed(0)
        model = _classifier(grad_checkpointing=checkpointed, depth=2)
        to_dropit(model, gamma=0.9)
        data = model.data_preprocessor(_batch(), training=True)
        model(**data, mode='loss')['loss'].backward()
        grads.append([param.grad for param in model.parameters()])
        assert model.model.grad_checkpointing is checkpointed
    assert all(torch.equal(a, b) for a, b in zip(*grads))


@pytest.mark.parametrize('kwargs,error', [
    (dict(model_name='vit_tiny_patch16_22'), ConfigError),
    (dict(label_smoothing=1.5), ConfigError),
    (dict(model_name='dla34', grad_checkpointing=True, img_size=None, patch_size=None,
          embed_dim=None, depth=None, num_heads=None), ConfigError),
    (dict(pretrained_file='/no/such/file.pth'), DataNotFoundError),
])
def test_bad_arguments_say_what_to_do(kwargs, error):
    with pytest.raises(error) as info:
        _classifier(**kwargs)
    assert len(str(info.value).splitlines()) == 1


def test_mnist5k_splits_are_disjoint_and_balanced():
    train = MNIST5kDataset(split='train')
    test = MNIST5kDataset(split='test')
    assert len(train) == 4500 and len(test) == 500
    labels = [test.get_data_info(i)['gt_label'] for i in range(len(test))]
    assert np.bincount(labels).tolist() == [50] * 10
    train_hashes = {train.get_data_info(i)['img'].tobytes() for i in range(len(train))}
    assert not any(test.get_data_info(i)['img'].tobytes() in train_hashes
                   for i in range(len(test)))


def test_cifar100_reads_the_python_pickle_release(tmp_path):
    folder = tmp_path / 'cifar-100-python'
    folder.mkdir()
    rng = np.random.default_rng(0)
    rgb = rng.integers(0, 256, size=(5, 3, 32, 32), dtype=np.uint8)
    with open(folder / 'test', 'wb') as stream:
        pickle.dump({'data': rgb.reshape(5, -1), 'fine_labels': [3, 1, 4, 1, 5]}, stream)
    with open(folder / 'meta', 'wb') as stream:
        pickle.dump({'fine_label_names': [f'class{i}' for i in range(100)]}, stream)
    dataset = CIFAR100Dataset(data_root=str(tmp_path), split='test',
                              pipeline=[dict(type='PackClsInputs')])
    assert len(dataset) == 5 and dataset.metainfo['classes'][3] == 'class3'
    item = dataset[2]
    assert int(item['data_samples'].gt_label) == 4
    # stored BGR, like LoadImageFromFile
    assert torch.equal(item['inputs'], torch.from_numpy(rgb[2][::-1].copy()))


class _WritesAFile:
    """A pickle payload: loading it would create ``path``."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (open, (self.path, 'w'))


@pytest.mark.parametrize('file', ['meta', 'train'])
def test_cifar100_refuses_a_pickle_that_runs_code(tmp_path, file):
    folder = tmp_path / 'cifar-100-python'
    folder.mkdir()
    marker = tmp_path / 'payload-ran'
    contents = {'meta': {'fine_label_names': ['a', 'b']},
                'train': {'data': np.zeros((1, 3072), np.uint8), 'fine_labels': [0]}}
    contents[file] = {'fine_label_names': _WritesAFile(marker), 'data': _WritesAFile(marker)}
    for name, value in contents.items():
        with open(folder / name, 'wb') as stream:
            pickle.dump(value, stream)
    with pytest.raises(DataFormatError, match=f'{file} is not a plain data pickle: it calls '
                       'io.open; refusing to load it'):
        CIFAR100Dataset(data_root=str(tmp_path), split='train', lazy_init=False)
    assert not marker.exists()


def test_image_folder_matches_files_to_class_folders(tmp_path):
    for name, count in (('cat', 2), ('dog', 3)):
        (tmp_path / 'val' / name).mkdir(parents=True)
        for i in range(count):
            cv2.imwrite(str(tmp_path / 'val' / name / f'{i}.png'),
                        np.full((8, 8, 3), 40 * i, np.uint8))
    dataset = ImageFolderDataset(
        data_root=str(tmp_path), split='val',
        pipeline=[dict(type='LoadImageFromFile'), dict(type='PackClsInputs')])
    assert dataset.metainfo['classes'] == ('cat', 'dog')
    labels = [int(dataset[i]['data_samples'].gt_label) for i in range(len(dataset))]
    assert labels == [0, 0, 1, 1, 1]
    assert dataset[4]['inputs'].shape == (3, 8, 8) and int(dataset[4]['inputs'].max()) == 80


@pytest.mark.parametrize('build', [
    lambda root: CIFAR100Dataset(data_root=root),
    lambda root: ImageFolderDataset(data_root=root),
])
def test_missing_data_gets_a_clear_error(tmp_path, build):
    with pytest.raises(DataNotFoundError, match='not found'):
        build(str(tmp_path / 'missing'))


def test_pack_handles_grayscale_and_unlabelled_images():
    packed = Compose([PackClsInputs()])(dict(img=np.zeros((5, 6), np.uint8)))
    assert packed['inputs'].shape == (1, 5, 6)
    assert 'gt_label' not in packed['data_samples']


def test_topk_accuracy_counts_hits():
    metric = TopKAccuracy(topk=(1, 2))
    scores = torch.tensor([[0.7, 0.2, 0.1], [0.5, 0.3, 0.2], [0.1, 0.2, 0.7], [0.2, 0.5, 0.3]])
    labels = [0, 1, 0, 1]
    samples = [BaseDataElement(pred_score=s, gt_label=torch.tensor([y])).to_dict()
               for s, y in zip(scores, labels)]
    metric.process({}, samples)
    result = metric.evaluate(size=4)
    assert result == {'accuracy/top1': 50.0, 'accuracy/top2': 75.0}
