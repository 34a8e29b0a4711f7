"""Mixup and CutMix on a training batch (timm's ``Mixup``), with soft targets for the loss.

Example config (DeiT's recipe; the soft targets carry the label smoothing)::

    data_preprocessor = dict(
        type='ClsDataPreprocessor', mean=None, std=None, bgr_to_rgb=False,
        mixup=dict(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=1000))
"""
from __future__ import annotations

from typing import Any

import torch
from mmengine.structures import BaseDataElement
from timm.data import Mixup

from ...errors import ConfigError


class BatchMixup:
    """Mix a batch with timm's :class:`~timm.data.Mixup` and store each sample's soft target.

    The mixed target of every sample goes to its data sample as ``gt_score`` (a probability
    vector), which :class:`~mmdropit.engine.classification.TimmClassifier` trains on with a
    soft-target cross-entropy. The batch size must be even (timm mixes a batch with its flip).

    Args:
        num_classes: Classes of the soft targets.
        **kwargs: Arguments of ``timm.data.Mixup`` (``mixup_alpha``, ``cutmix_alpha``,
            ``label_smoothing``, ``prob``, ``switch_prob``, ``mode``).
    """

    def __init__(self, num_classes: int | None = None, **kwargs: Any) -> None:
        if not isinstance(num_classes, int) or num_classes < 2:
            raise ConfigError(f'mixup needs num_classes, an int >= 2; got {num_classes!r}')
        try:
            self.mixup = Mixup(num_classes=num_classes, **kwargs)
        except TypeError as error:
            raise ConfigError(f'mixup={kwargs}: timm.data.Mixup refused these arguments: '
                              f'{error}') from error

    def __call__(self, inputs: torch.Tensor,
                 data_samples: list[BaseDataElement]) -> torch.Tensor:
        """Return the mixed batch; set ``gt_score`` on each of ``data_samples``."""
        if len(inputs) % 2:
            raise ConfigError(f'mixup needs an even number of samples in each batch and '
                              f'micro-batch, got {len(inputs)}: set train_dataloader.batch_size '
                              'to an even number (and drop_last=True), and micro_batches to a '
                              'count that splits it into even parts')
        target = torch.cat([sample.gt_label for sample in data_samples]).to(inputs.device)
        mixed, scores = self.mixup(inputs, target)
        for sample, score in zip(data_samples, scores):
            sample.gt_score = score
        return mixed
