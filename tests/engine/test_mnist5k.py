"""MNIST5kDataset stores the classes interleaved, so MMEngine's ``indices=N`` keeps every class."""
from __future__ import annotations

import hashlib

import numpy as np
import pytest
from mmengine.config import Config
from mmengine.registry import DATASETS

import mmdropit  # noqa: F401  (registers MNIST5kDataset)
from mmdropit.data.mnist5k import interleave_classes, load_mnist5k
from tests.conftest import ROOT

TINY_BASE = ROOT / 'configs' / 'tiny' / '_base_' / 'mnist5k_classification.py'

# sha256 of the sorted (sha256 of the image bytes, label) pairs of each split, computed with the
# class-sorted loader before the interleaved order: which images are train / test must not change.
SPLIT_DIGESTS = {
    'train': '7664cffb16c3bb00e93f00a08965e854a87fe78a7f2a7ed096b435a192e8e395',
    'test': '4088343f742e65c23a9dbd63adc4c2b14ac5ed84f624314182ea26507b610474',
}


def _build(loader: str, **changes):
    """The dataset as a config builds it: the tiny base config's dict, through the registry."""
    cfg = Config.fromfile(TINY_BASE)
    dataset_cfg = cfg[loader].dataset
    dataset_cfg.update(changes)
    return DATASETS.build(dataset_cfg)


def _labels(dataset) -> np.ndarray:
    return np.array([dataset.get_data_info(i)['gt_label'] for i in range(len(dataset))])


def _digest(images, labels) -> str:
    pairs = sorted((hashlib.sha256(np.ascontiguousarray(image).tobytes()).hexdigest(), int(label))
                   for image, label in zip(images, labels))
    return hashlib.sha256(repr(pairs).encode()).hexdigest()


def test_indices_64_keeps_every_class_in_train_and_test():
    train = _build('train_dataloader', indices=64)
    test = _build('val_dataloader', indices=64)
    assert len(train) == len(test) == 64
    for dataset in (train, test):
        counts = np.bincount(_labels(dataset), minlength=10)
        assert counts.tolist() == [7] * 4 + [6] * 6  # as even as 64 samples allow
    assert set(_labels(test)[:20].tolist()) == set(range(10))
    # what a 1-epoch tiny run sees through the runner's dataloader (first batch of the subset)
    item = train[0]
    assert int(item['data_samples'].gt_label) == 0 and tuple(item['inputs'].shape) == (1, 28, 28)


@pytest.mark.parametrize('split,per_class', [('train', 450), ('test', 50)])
def test_order_is_sample_i_of_class_c_at_i_times_10_plus_c(split, per_class):
    dataset = _build('train_dataloader', split=split)
    labels = _labels(dataset)
    assert labels.tolist() == list(range(10)) * per_class
    # within a class, the file's order is kept: position i * 10 + c is sample i of class c
    images, by_class = load_mnist5k(split)  # the class-sorted order
    for c in (0, 9):
        members = images[by_class == c]
        for i in (0, 1, per_class - 1):
            np.testing.assert_array_equal(dataset.get_data_info(i * 10 + c)['img'][..., 0],
                                          members[i])
    # the same order every time, with no random numbers involved
    assert _labels(_build('train_dataloader', split=split, indices=30)).tolist() == labels[:30].tolist()


@pytest.mark.parametrize('split', ['train', 'test'])
def test_split_content_is_unchanged_by_the_order(split):
    dataset = _build('train_dataloader', split=split)
    images = [dataset.get_data_info(i)['img'][..., 0] for i in range(len(dataset))]
    labels = _labels(dataset)
    assert np.bincount(labels).tolist() == [450 if split == 'train' else 50] * 10
    assert _digest(images, labels) == SPLIT_DIGESTS[split]
    assert _digest(*load_mnist5k(split)) == SPLIT_DIGESTS[split]
    assert _digest(*load_mnist5k(split, order='interleaved')) == SPLIT_DIGESTS[split]


def test_interleave_classes_with_unequal_classes_skips_the_ones_that_ran_out():
    labels = np.array([0, 0, 0, 1, 2, 2])
    order = interleave_classes(labels)
    assert sorted(order.tolist()) == list(range(6))
    assert labels[order].tolist() == [0, 1, 2, 0, 2, 0]
    assert order.tolist() == [0, 3, 4, 1, 5, 2]  # within a class, the given order is kept


def test_unknown_order_is_refused():
    with pytest.raises(ValueError, match='order'):
        load_mnist5k('train', order='random')
