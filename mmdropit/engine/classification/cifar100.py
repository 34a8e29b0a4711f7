"""CIFAR-100 from its original python-pickle release, as an MMEngine dataset.

Example config::

    train_dataloader = dict(
        batch_size=128, sampler=dict(type='DefaultSampler', shuffle=True),
        dataset=dict(type='CIFAR100Dataset', data_root='data/cifar100', split='train',
                     pipeline=[dict(type='Resize', scale=(224, 224)), dict(type='PackClsInputs')]))
"""
from __future__ import annotations

import os.path as osp

import numpy as np
from mmengine.dataset import BaseDataset
from mmengine.registry import DATASETS

from ...data.safe_pickle import load_data_pickle
from ...errors import DataNotFoundError

ARCHIVE_DIR = 'cifar-100-python'


@DATASETS.register_module()
class CIFAR100Dataset(BaseDataset):
    """CIFAR-100 (50,000 train / 10,000 test images, 32x32, 100 fine classes).

    ``data_root`` is the folder that holds ``cifar-100-python/`` (as unpacked from
    ``cifar-100-python.tar.gz``) or that folder itself. Its pickles are read without running
    code (:func:`~mmdropit.data.safe_pickle.load_data_pickle`): a file that names anything but
    data and numpy arrays is refused. Images are stored BGR, like
    mmcv's ``LoadImageFromFile`` output, so one ``ClsDataPreprocessor`` (``bgr_to_rgb=True``)
    serves image folders and CIFAR alike.

    Args:
        data_root: see above.
        split: ``'train'`` or ``'test'``.
        **kwargs: passed to :class:`mmengine.dataset.BaseDataset`.
    """

    def __init__(self, data_root: str, split: str = 'train', **kwargs) -> None:
        if split not in ('train', 'test'):
            raise ValueError(f'unknown CIFAR-100 split {split!r}; use "train" or "test"')
        self.split = split
        folder = osp.join(data_root, ARCHIVE_DIR)
        self.folder = folder if osp.isdir(folder) else data_root
        for name in (split, 'meta'):
            if not osp.isfile(osp.join(self.folder, name)):
                raise DataNotFoundError(
                    f'CIFAR-100 file {osp.join(self.folder, name)!r} not found: unpack '
                    f'cifar-100-python.tar.gz into {data_root!r} or fix data_root')
        meta = osp.join(self.folder, 'meta')
        with open(meta, 'rb') as stream:
            classes = tuple(load_data_pickle(stream, meta)['fine_label_names'])
        import mmcv.transforms  # noqa: F401  (registers LoadImageFromFile, Resize, ... at the root)
        super().__init__(data_root=data_root, metainfo=dict(classes=classes), **kwargs)

    def load_data_list(self) -> list[dict]:
        path = osp.join(self.folder, self.split)
        with open(path, 'rb') as stream:
            entry = load_data_pickle(stream, path)
        rgb = np.asarray(entry['data'], dtype=np.uint8).reshape(-1, 3, 32, 32)
        bgr = np.ascontiguousarray(rgb[:, ::-1].transpose(0, 2, 3, 1))
        return [dict(img=image, gt_label=int(label))
                for image, label in zip(bgr, entry['fine_labels'])]
