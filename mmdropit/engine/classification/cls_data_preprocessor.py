"""Batch preprocessing for classification: stack, convert colour order, normalise, and
optionally Mixup / CutMix the training batch.

Example config::

    data_preprocessor = dict(
        type='ClsDataPreprocessor',
        mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375], bgr_to_rgb=True)
"""
from __future__ import annotations

from mmengine.model import ImgDataPreprocessor
from mmengine.registry import MODELS

from .batch_mixup import BatchMixup


@MODELS.register_module()
class ClsDataPreprocessor(ImgDataPreprocessor):
    """MMEngine's image preprocessor, with classification defaults.

    Images arrive as uint8 ``[C, H, W]`` tensors (BGR when they have three channels, as
    mmcv's ``LoadImageFromFile`` and our array datasets produce); labels stay in the
    data samples. Defaults are the ImageNet mean/std in RGB order; a single-channel set
    (MNIST) passes one value each. Images that a pipeline already normalised
    (:class:`~mmdropit.engine.classification.TimmTransform`) take ``mean=None, std=None,
    bgr_to_rgb=False``.

    Args:
        mean: per-channel mean, on the 0-255 scale; ``None`` leaves the values as they are.
        std: per-channel standard deviation, on the 0-255 scale.
        bgr_to_rgb: swap BGR to RGB (three-channel images only).
        mixup: arguments of :class:`~mmdropit.engine.classification.batch_mixup.BatchMixup`
            (timm's Mixup / CutMix), applied to training batches only.
        **kwargs: passed to :class:`mmengine.model.ImgDataPreprocessor`.
    """

    def __init__(self,
                 mean: tuple[float, ...] | None = (123.675, 116.28, 103.53),
                 std: tuple[float, ...] | None = (58.395, 57.12, 57.375),
                 bgr_to_rgb: bool = True,
                 mixup: dict | None = None,
                 **kwargs) -> None:
        super().__init__(mean=mean, std=std,
                         bgr_to_rgb=bgr_to_rgb and mean is not None and len(mean) == 3,
                         **kwargs)
        self.mixup = BatchMixup(**mixup) if mixup else None

    def forward(self, data: dict, training: bool = False) -> dict:
        """Stack and normalise; in training, mix the batch when ``mixup`` is set."""
        data = super().forward(data, training)
        if training and self.mixup is not None:
            data['inputs'] = self.mixup(data['inputs'], data['data_samples'])
        return data
