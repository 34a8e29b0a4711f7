"""DeiT's ImageNet recipe through timm: TimmTransform in the pipeline, Mixup / CutMix in the data
preprocessor, soft targets in TimmClassifier's loss -- on an image folder of real digits."""
from __future__ import annotations

import cv2
import pytest
import torch
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmengine.registry import HOOKS, MODELS
from mmengine.runner import Runner
from mmengine.structures import BaseDataElement

import mmdropit  # noqa: F401
from mmdropit.dropit import dropit_layers
from mmdropit.engine.classification import TimmTransform
from mmdropit.data.mnist5k import load_mnist5k
from mmdropit.engine.classification import ClsDataPreprocessor
from mmdropit.errors import ConfigError
from mmdropit.microbatch import micro_batch_sizes
from tests.conftest import ROOT

DEIT_TI_DROPIT = ROOT / 'configs' / 'deit' / 'deit-ti_dropit-mink0.5_8xb128_in1k.py'


@pytest.fixture(scope='module')
def digit_folder(tmp_path_factory):
    """``train/<digit>/*.png``: four real MNIST digits of each of two classes."""
    root = tmp_path_factory.mktemp('imagenet_like')
    images, labels = load_mnist5k('train')
    for digit in (3, 7):
        folder = root / 'train' / f'n0000000{digit}'
        folder.mkdir(parents=True)
        for index, image in enumerate(images[labels == digit][:4]):
            cv2.imwrite(str(folder / f'{index}.png'), cv2.resize(image, (64, 64)))
    return root


def test_deit_ti_dropit_config_trains_one_step_on_its_own_pipeline(digit_folder):
    cfg = Config.fromfile(DEIT_TI_DROPIT)
    loader = cfg.train_dataloader
    loader.update(batch_size=4, num_workers=0, persistent_workers=False)
    loader.dataset.data_root = str(digit_folder)
    batch = next(iter(Runner.build_dataloader(loader)))
    assert batch['inputs'][0].dtype == torch.float32
    assert batch['inputs'][0].shape == (3, 224, 224)
    assert batch['inputs'][0].min() < -1  # normalised by timm (black digit background)

    model = MODELS.build(cfg.model).train()
    HOOKS.build(cfg.custom_hooks[0]).apply(model)
    assert dropit_layers(model)
    optim_wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    losses = model.train_step(batch, optim_wrapper)
    assert torch.isfinite(losses['loss'])
    mixed = model.data_preprocessor(batch, training=True)['data_samples']
    scores = torch.stack([sample.gt_score for sample in mixed])
    assert scores.shape == (4, 1000)
    assert torch.allclose(scores.sum(dim=1), torch.ones(4))
    assert scores.min() > 0  # label smoothing 0.1 over 1000 classes


def test_soft_target_loss_equals_cross_entropy_on_one_hot_scores():
    model = MODELS.build(dict(type='TimmClassifier', model_name='deit_tiny_patch16_224',
                              num_classes=5, img_size=32, patch_size=16, depth=1))
    logits = torch.randn(3, 5)
    labels = torch.tensor([0, 4, 2])
    hard = [BaseDataElement(gt_label=label.view(1)) for label in labels]
    soft = [BaseDataElement(gt_label=label.view(1),
                            gt_score=torch.nn.functional.one_hot(label, 5).float())
            for label in labels]
    assert torch.allclose(model.loss(logits, soft), model.loss(logits, hard))


def test_mixup_only_in_training_and_only_on_even_batches():
    preprocessor = ClsDataPreprocessor(mean=None, std=None, bgr_to_rgb=False,
                                       mixup=dict(mixup_alpha=0.8, num_classes=10))
    samples = [BaseDataElement(gt_label=torch.tensor([label])) for label in (1, 2)]
    data = dict(inputs=[torch.rand(3, 8, 8), torch.rand(3, 8, 8)], data_samples=samples)
    out = preprocessor(dict(data), training=False)
    assert torch.equal(out['inputs'][0], data['inputs'][0])
    assert 'gt_score' not in out['data_samples'][0]
    torch.manual_seed(0)
    mixed = preprocessor(dict(data), training=True)
    score = mixed['data_samples'][0].gt_score
    assert score.shape == (10,)
    assert (score > 0.05).nonzero().view(-1).tolist() == [1, 2]  # mixed with the flipped batch
    with pytest.raises(ConfigError, match='even number of samples'):
        preprocessor(dict(inputs=data['inputs'][:1], data_samples=samples[:1]), training=True)


def test_bad_timm_arguments_are_config_errors():
    with pytest.raises(ConfigError, match='create_transform refused'):
        TimmTransform(input_size=224, no_such_argument=1)
    with pytest.raises(ConfigError, match='normalised tensor'):
        TimmTransform(input_size=224, separate=True)
    with pytest.raises(ConfigError, match='num_classes'):
        ClsDataPreprocessor(mixup=dict(mixup_alpha=0.8))


def _mixup_vit():
    torch.manual_seed(0)
    return MODELS.build(dict(
        type='TimmClassifier', model_name='vit_tiny_patch16_224', num_classes=10, img_size=32,
        patch_size=8, depth=2,
        data_preprocessor=dict(type='ClsDataPreprocessor', mean=None, std=None,
                               bgr_to_rgb=False, mixup=dict(mixup_alpha=0.8, cutmix_alpha=1.0,
                                                            num_classes=10))))


def _digit_batch(size: int) -> dict:
    images, labels = load_mnist5k('train')
    inputs = [torch.from_numpy(cv2.resize(image, (32, 32))).float().expand(3, 32, 32) / 255
              for image in images[:size]]
    return dict(inputs=inputs, data_samples=[BaseDataElement(gt_label=torch.tensor([int(label)]))
                                             for label in labels[:size]])


def test_a_memory_budget_splits_a_mixup_batch_into_even_parts():
    """Mixup cannot run on one sample or an odd part: the split search measures the parts
    that train (before, its trial of one sample failed with Mixup's error)."""
    model = _mixup_vit()
    wrapper = build_optim_wrapper(model, dict(
        type='MicroBatchOptimWrapper', memory_budget=0.8,
        optimizer=dict(type='SGD', lr=0.01)))
    wrapper.initialize_count_status(model, 0, 2)
    losses = model.train_step(_digit_batch(12), wrapper)
    assert torch.isfinite(losses['loss'])
    decision = wrapper.split_decision
    assert decision.micro_batches > 1 and decision.peak_bytes <= decision.budget_bytes
    assert all(size % 2 == 0 for size in micro_batch_sizes(12, decision.micro_batches))


def test_micro_batches_that_leave_an_odd_part_for_mixup_say_so():
    model = _mixup_vit()
    wrapper = build_optim_wrapper(model, dict(
        type='MicroBatchOptimWrapper', micro_batches=3, optimizer=dict(type='SGD', lr=0.01)))
    wrapper.initialize_count_status(model, 0, 2)
    with pytest.raises(ConfigError, match='micro_batches to a count that splits it into even'):
        model.train_step(_digit_batch(8), wrapper)  # 3 + 3 + 2
