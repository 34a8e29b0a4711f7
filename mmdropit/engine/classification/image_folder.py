"""An ImageNet-style folder (one sub-folder per class) as an MMEngine dataset.

Example config::

    train_dataloader = dict(
        batch_size=64, sampler=dict(type='DefaultSampler', shuffle=True),
        dataset=dict(type='ImageFolderDataset', data_root='data/imagenet', split='train',
                     pipeline=[dict(type='LoadImageFromFile'),
                               dict(type='Resize', scale=(224, 224)), dict(type='PackClsInputs')]))
"""
from __future__ import annotations

import os
import os.path as osp

from mmengine.dataset import BaseDataset
from mmengine.registry import DATASETS

from ...errors import DataNotFoundError

IMAGE_EXTENSIONS = ('.jpg', '.jpeg', '.png', '.bmp', '.ppm', '.pgm', '.tif', '.tiff', '.webp')


@DATASETS.register_module()
class ImageFolderDataset(BaseDataset):
    """``<data_root>/<split>/<class name>/<image>``, classes sorted by name.

    Each item has ``img_path`` and ``gt_label``; start the pipeline with
    ``LoadImageFromFile``. Pass ``classes`` to fix the class order of another split
    (ImageNet's ``val`` then uses the ``train`` order even where a class is missing).

    Args:
        data_root: root folder of the dataset.
        split: sub-folder of the split, e.g. ``'train'`` or ``'val'``.
        classes: class folder names in label order; default: the sorted sub-folders.
        **kwargs: passed to :class:`mmengine.dataset.BaseDataset`.
    """

    def __init__(self, data_root: str, split: str = 'train',
                 classes: tuple[str, ...] | None = None, **kwargs) -> None:
        self.split_dir = osp.join(data_root, split)
        if not osp.isdir(self.split_dir):
            raise DataNotFoundError(
                f'image folder {self.split_dir!r} not found: set data_root / split to '
                'a folder with one sub-folder of images per class')
        if classes is None:
            classes = tuple(sorted(
                entry.name for entry in os.scandir(self.split_dir) if entry.is_dir()))
        if not classes:
            raise DataNotFoundError(f'{self.split_dir!r} has no class sub-folders')
        import mmcv.transforms  # noqa: F401  (registers LoadImageFromFile, Resize, ... at the root)
        super().__init__(data_root=data_root, metainfo=dict(classes=tuple(classes)), **kwargs)

    def load_data_list(self) -> list[dict]:
        data_list = []
        for label, name in enumerate(self.metainfo['classes']):
            class_dir = osp.join(self.split_dir, name)
            if not osp.isdir(class_dir):
                continue
            for root, _, files in sorted(os.walk(class_dir)):
                data_list.extend(
                    dict(img_path=osp.join(root, file), gt_label=label)
                    for file in sorted(files) if file.lower().endswith(IMAGE_EXTENSIONS))
        if not data_list:
            raise DataNotFoundError(f'no images with extensions {IMAGE_EXTENSIONS} under '
                                    f'{self.split_dir!r}')
        return data_list
