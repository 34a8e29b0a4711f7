"""The last transform of a classification pipeline: image to tensor, label to data sample.

Example config::

    train_pipeline = [dict(type='LoadImageFromFile'), dict(type='Resize', scale=(224, 224)),
                      dict(type='PackClsInputs')]
"""
from __future__ import annotations

import numpy as np
import torch
from mmengine.registry import TRANSFORMS
from mmengine.structures import BaseDataElement


@TRANSFORMS.register_module()
class PackClsInputs:
    """Pack ``results['img']`` and ``results['gt_label']`` for :class:`TimmClassifier`.

    Produces ``{'inputs': tensor [C, H, W], 'data_samples': BaseDataElement}`` (an image
    array becomes a ``uint8`` tensor; a tensor, such as :class:`TimmTransform`'s, is kept) with
    ``gt_label`` (a 1-element int64 tensor, absent when the sample has no label) and the
    metainfo keys listed in ``meta_keys`` that are present.

    Args:
        meta_keys: keys of ``results`` copied into the data sample's metainfo.
    """

    def __init__(self, meta_keys: tuple[str, ...] = ('sample_idx', 'img_path', 'img_shape')):
        self.meta_keys = meta_keys

    def __call__(self, results: dict) -> dict:
        img = results['img']
        if isinstance(img, torch.Tensor):  # already [C, H, W], e.g. from TimmTransform
            inputs = img
        else:
            img = np.asarray(img)
            if img.ndim == 2:
                img = img[..., None]
            inputs = torch.from_numpy(np.ascontiguousarray(img.transpose(2, 0, 1)))
        sample = BaseDataElement(
            metainfo={key: results[key] for key in self.meta_keys if key in results})
        if results.get('gt_label') is not None:
            sample.gt_label = torch.as_tensor(results['gt_label'], dtype=torch.int64).view(1)
        return {'inputs': inputs, 'data_samples': sample}

    def __repr__(self) -> str:
        return f'{self.__class__.__name__}(meta_keys={self.meta_keys})'
