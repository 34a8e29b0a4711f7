"""Batch preprocessing for classification: stack, convert colour order, normalise.

Example config::

    data_preprocessor = dict(
        type='ClsDataPreprocessor',
        mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375], bgr_to_rgb=True)
"""
from __future__ import annotations

from mmengine.model import ImgDataPreprocessor
from mmengine.registry import MODELS


@MODELS.register_module()
class ClsDataPreprocessor(ImgDataPreprocessor):
    """MMEngine's image preprocessor, with classification defaults.

    Images arrive as uint8 ``[C, H, W]`` tensors (BGR when they have three channels, as
    mmcv's ``LoadImageFromFile`` and our array datasets produce); labels stay in the
    data samples. Defaults are the ImageNet mean/std in RGB order; a single-channel set
    (MNIST) passes one value each.

    Args:
        mean: per-channel mean, on the 0-255 scale.
        std: per-channel standard deviation, on the 0-255 scale.
        bgr_to_rgb: swap BGR to RGB (three-channel images only).
        **kwargs: passed to :class:`mmengine.model.ImgDataPreprocessor`.
    """

    def __init__(self,
                 mean: tuple[float, ...] = (123.675, 116.28, 103.53),
                 std: tuple[float, ...] = (58.395, 57.12, 57.375),
                 bgr_to_rgb: bool = True,
                 **kwargs) -> None:
        super().__init__(mean=mean, std=std, bgr_to_rgb=bgr_to_rgb and len(mean) == 3,
                         **kwargs)
