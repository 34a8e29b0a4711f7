"""The digits-on-canvas COCO set: determinism, exact boxes and masks, and mmdet reading it."""
from __future__ import annotations

import itertools
import json
from pathlib import Path

import cv2
import numpy as np
import pytest
import torch
from pycocotools import mask as mask_utils

from mmdropit.data.digit_canvas import CLASSES, MASK_THRESHOLD, make_digit_coco
from mmdropit.data.mnist5k import load_mnist5k

CONFIG = Path(__file__).parents[2] / 'configs' / 'tiny' / '_base_' / 'digit_coco_detection.py'
SPLIT_SOURCES = {'train': 'train', 'val': 'test'}


def _read(paths: dict[str, Path], split: str) -> dict:
    with open(paths[f'{split}_ann']) as stream:
        return json.load(stream)


def _set_bytes(paths: dict[str, Path]) -> dict[str, bytes]:
    """Every file of a generated set, keyed by split and name."""
    files = {}
    for split in ('train', 'val'):
        files[f'{split}_ann'] = paths[f'{split}_ann'].read_bytes()
        for image in sorted(paths[f'{split}_img'].glob('*.png')):
            files[f'{split}/{image.name}'] = image.read_bytes()
    return files


@pytest.fixture(scope='module')
def digit_set(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    return make_digit_coco(tmp_path_factory.mktemp('digit_coco'), num_train=20, num_val=10)


@pytest.fixture(scope='module')
def mmdet_scope():
    """Resolve config type names in mmdet's registries, then restore the default scope."""
    from mmdet.utils import register_all_modules
    from mmengine.registry import DefaultScope
    register_all_modules(init_default_scope=False)
    with DefaultScope.overwrite_default_scope('mmdet'):
        yield


def _val_dataset(paths: dict[str, Path]):
    from mmdet.datasets import CocoDataset
    return CocoDataset(
        data_root=str(paths['val_ann'].parents[1]),
        ann_file='annotations/instances_val.json',
        data_prefix=dict(img='val/'),
        metainfo=dict(classes=CLASSES),
        test_mode=True,
        pipeline=[
            dict(type='LoadImageFromFile'),
            dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
            dict(type='PackDetInputs'),
        ])


def test_same_seed_same_files_other_seed_other_files(tmp_path: Path) -> None:
    small = dict(num_train=4, num_val=2)
    first = _set_bytes(make_digit_coco(tmp_path / 'a', seed=0, **small))
    again = _set_bytes(make_digit_coco(tmp_path / 'b', seed=0, **small))
    other = _set_bytes(make_digit_coco(tmp_path / 'c', seed=1, **small))
    assert len(first) == 2 + 4 + 2
    assert first == again
    assert all(first[name] != other[name] for name in first)


def test_existing_set_is_reused_unless_parameters_or_images_change(tmp_path: Path) -> None:
    paths = make_digit_coco(tmp_path, num_train=3, num_val=2)
    written = paths['val_ann'].stat().st_mtime_ns
    make_digit_coco(tmp_path, num_train=3, num_val=2)
    assert paths['val_ann'].stat().st_mtime_ns == written

    (paths['val_img'] / '000001.png').unlink()
    make_digit_coco(tmp_path, num_train=3, num_val=2)
    assert (paths['val_img'] / '000001.png').is_file()

    make_digit_coco(tmp_path, num_train=3, num_val=2, seed=7)
    assert _read(paths, 'val')['info']['seed'] == 7
    assert _read(paths, 'train')['info']['seed'] == 7


def test_json_layout_and_categories(digit_set: dict[str, Path]) -> None:
    for split, num_images in (('train', 20), ('val', 10)):
        coco = _read(digit_set, split)
        assert coco['info']['generator_version'] >= 1 and coco['info']['seed'] == 0
        assert [(c['id'], c['name']) for c in coco['categories']] == [
            (label + 1, name) for label, name in enumerate(CLASSES)]
        assert len(coco['images']) == num_images
        assert len({ann['id'] for ann in coco['annotations']}) == len(coco['annotations'])
        image = cv2.imread(str(digit_set[f'{split}_img'] / coco['images'][0]['file_name']),
                           cv2.IMREAD_UNCHANGED)
        assert image.shape == (256, 256, 3)


@pytest.mark.parametrize('split', ['train', 'val'])
def test_boxes_tightly_enclose_masks_and_never_overlap(digit_set: dict[str, Path],
                                                       split: str) -> None:
    coco = _read(digit_set, split)
    boxes_per_image = {}
    for ann in coco['annotations']:
        assert isinstance(ann['segmentation']['counts'], str) and ann['iscrowd'] == 0
        mask = mask_utils.decode(ann['segmentation'])
        rows, cols = np.nonzero(mask)
        x, y, w, h = ann['bbox']
        assert [x, y, w, h] == [cols.min(), rows.min(), cols.max() - cols.min() + 1,
                                rows.max() - rows.min() + 1]
        assert mask_utils.toBbox(ann['segmentation']).tolist() == ann['bbox']
        assert ann['area'] == mask.sum() == mask[y:y + h, x:x + w].sum()
        boxes_per_image.setdefault(ann['image_id'], []).append(ann['bbox'])
    assert set(boxes_per_image) == {image['id'] for image in coco['images']}
    for boxes in boxes_per_image.values():
        for (ax, ay, aw, ah), (bx, by, bw, bh) in itertools.combinations(boxes, 2):
            assert ax + aw <= bx or bx + bw <= ax or ay + ah <= by or by + bh <= ay


@pytest.mark.parametrize('split', ['train', 'val'])
def test_masks_are_the_strokes_of_digits_from_the_matching_mnist_split(
        digit_set: dict[str, Path], split: str) -> None:
    digits, labels = load_mnist5k(SPLIT_SOURCES[split])
    for ann in _read(digit_set, split)['annotations']:
        source = ann['digit']
        assert source['split'] == SPLIT_SOURCES[split]
        assert ann['category_id'] == labels[source['index']] + 1
        size = source['size']
        stroke = cv2.resize(digits[source['index']], (size, size),
                            interpolation=cv2.INTER_LINEAR) >= MASK_THRESHOLD
        rows, cols = np.nonzero(stroke)
        x, y, w, h = ann['bbox']
        tight = stroke[rows.min():rows.max() + 1, cols.min():cols.max() + 1]
        np.testing.assert_array_equal(
            mask_utils.decode(ann['segmentation'])[y:y + h, x:x + w], tight)


def test_mmdet_coco_dataset_loads_boxes_and_rle_masks(digit_set: dict[str, Path],
                                                      mmdet_scope) -> None:
    from mmdet.structures.mask import mask2bbox
    coco = _read(digit_set, 'val')
    dataset = _val_dataset(digit_set)
    assert len(dataset) == 10
    for item in dataset:
        sample = item['data_samples']
        anns = [ann for ann in coco['annotations'] if ann['image_id'] == sample.img_id]
        gt = sample.gt_instances
        assert item['inputs'].shape == (3, 256, 256)
        assert len(gt) == len(anns) and len(sample.ignored_instances) == 0
        masks = gt.masks.to_tensor(torch.bool, 'cpu')
        assert masks.sum(dim=(1, 2)).tolist() == [ann['area'] for ann in anns]
        assert gt.labels.tolist() == [ann['category_id'] - 1 for ann in anns]
        expected = torch.tensor([[x, y, x + w, y + h] for x, y, w, h in
                                 (ann['bbox'] for ann in anns)], dtype=torch.float32)
        torch.testing.assert_close(gt.bboxes.tensor, expected)
        torch.testing.assert_close(mask2bbox(masks), expected)


def test_coco_metric_scores_ground_truth_as_perfect(digit_set: dict[str, Path],
                                                    mmdet_scope) -> None:
    from mmdet.evaluation import CocoMetric
    dataset = _val_dataset(digit_set)
    metric = CocoMetric(ann_file=str(digit_set['val_ann']), metric=['bbox', 'segm'])
    metric.dataset_meta = dataset.metainfo
    for item in dataset:
        sample = item['data_samples']
        gt = sample.gt_instances
        prediction = dict(bboxes=gt.bboxes.tensor, labels=gt.labels,
                          scores=torch.ones(len(gt)), masks=gt.masks.to_tensor(torch.bool, 'cpu'))
        metric.process({}, [dict(img_id=sample.img_id, ori_shape=sample.ori_shape,
                                 pred_instances=prediction)])
    scores = metric.evaluate(len(dataset))
    assert scores['coco/bbox_mAP'] == pytest.approx(1.0)
    assert scores['coco/segm_mAP'] == pytest.approx(1.0)


def test_base_config_builds_the_datasets(digit_set: dict[str, Path], mmdet_scope) -> None:
    from mmdet.registry import DATASETS
    from mmengine.config import Config
    cfg = Config.fromfile(str(CONFIG))
    assert cfg.metainfo['classes'] == CLASSES
    assert all(step['type'] != 'RandomFlip' for step in cfg.train_pipeline)
    assert cfg.val_evaluator['ann_file'] == cfg.data_root + 'annotations/instances_val.json'
    for split, num_images in (('train', 20), ('val', 10)):
        dataset_cfg = cfg[f'{split}_dataloader']['dataset']
        dataset_cfg['data_root'] = str(digit_set['val_ann'].parents[1])
        dataset = DATASETS.build(dataset_cfg)
        assert len(dataset) == num_images
        assert dataset.metainfo['classes'] == CLASSES
        assert len(dataset[0]['data_samples'].gt_instances) >= 1
