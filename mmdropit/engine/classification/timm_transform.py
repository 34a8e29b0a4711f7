"""timm's image transforms (RandAugment, random erasing, ...) as one MMEngine pipeline step.

DeiT's training recipe is timm's ``create_transform``: random resized crop, flip,
RandAugment, colour jitter, normalisation, then random erasing on the normalised tensor. This
step runs it on the image that ``LoadImageFromFile`` read, so a config gets the recipe
without mmpretrain. Its output is the normalised float tensor; the model's
``ClsDataPreprocessor`` must then not normalise again (``mean=None, std=None``).

Example config (DeiT's ImageNet training and evaluation)::

    train_pipeline = [
        dict(type='LoadImageFromFile'),
        dict(type='TimmTransform', is_training=True, input_size=224,
             auto_augment='rand-m9-mstd0.5-inc1', interpolation='bicubic',
             re_prob=0.25, re_mode='pixel'),
        dict(type='PackClsInputs'),
    ]
    test_pipeline = [
        dict(type='LoadImageFromFile'),
        dict(type='TimmTransform', input_size=224, crop_pct=0.875, interpolation='bicubic'),
        dict(type='PackClsInputs'),
    ]
"""
from __future__ import annotations

from typing import Any

import numpy as np
from mmengine.registry import TRANSFORMS
from PIL import Image
from timm.data import create_transform

from ...errors import ConfigError


@TRANSFORMS.register_module()
class TimmTransform:
    """Apply ``timm.data.create_transform(**kwargs)`` to ``results['img']``.

    The image arrives as mmcv reads it (``uint8`` ``[H, W, C]``, BGR) or single-channel
    ``[H, W]``; it is given to timm as an RGB (or ``L``) PIL image. ``results['img']``
    becomes timm's normalised ``float32`` tensor ``[C, H, W]`` and ``img_shape`` its size.

    Args:
        **kwargs: Arguments of ``timm.data.create_transform`` (``input_size``,
            ``is_training``, ``auto_augment``, ``re_prob``, ``mean``, ``std``, ...).
            ``separate``, ``use_prefetcher`` and ``normalize=False`` are refused: the step
            must end with one normalised tensor.
    """

    def __init__(self, **kwargs: Any) -> None:
        refused = [key for key in ('separate', 'use_prefetcher') if kwargs.get(key)]
        if kwargs.get('normalize') is False:
            refused.append('normalize=False')
        if refused:
            raise ConfigError(f'TimmTransform needs one normalised tensor out of timm; drop '
                              f'{", ".join(refused)}')
        try:
            self.transform = create_transform(**kwargs)
        except (TypeError, ValueError, AssertionError) as error:
            raise ConfigError(f'TimmTransform({kwargs}): timm.data.create_transform refused '
                              f'these arguments: {error}') from error
        self.kwargs = kwargs

    def __call__(self, results: dict) -> dict:
        img = np.asarray(results['img'])
        if img.ndim == 3 and img.shape[2] == 1:
            img = img[..., 0]
        pil = Image.fromarray(img[..., ::-1].copy() if img.ndim == 3 else img)
        tensor = self.transform(pil)
        results['img'] = tensor
        results['img_shape'] = tuple(tensor.shape[-2:])
        return results

    def __repr__(self) -> str:
        args = ', '.join(f'{key}={value!r}' for key, value in self.kwargs.items())
        return f'{self.__class__.__name__}({args})'
