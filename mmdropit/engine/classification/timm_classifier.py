"""Image classification with any timm model inside an MMEngine Runner (no mmpretrain).

Example config::

    model = dict(
        type='TimmClassifier',
        model_name='deit_small_patch16_224',
        num_classes=100,
        pretrained_file='checkpoints/deit_small_patch16_224.pth',  # optional, local file
        label_smoothing=0.1,
        grad_checkpointing=True,  # optional: timm's per-block checkpointing
        data_preprocessor=dict(type='ClsDataPreprocessor',
                               mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375]))
"""
from __future__ import annotations

import difflib
import os.path as osp
from typing import Any

import timm
import torch
import torch.nn.functional as F
from mmengine.model import BaseModel
from mmengine.model.weight_init import initialize
from mmengine.registry import MODELS
from mmengine.structures import BaseDataElement

from ...errors import ConfigError, DataNotFoundError


@MODELS.register_module()
class TimmClassifier(BaseModel):
    """A timm model trained with cross-entropy (optionally label-smoothed).

    The timm network is kept as ``self.model`` so its module names (``model.blocks.0.attn``)
    and ``state_dict`` keys (``model.head.weight``) are predictable in configs and checkpoints.

    Args:
        model_name: a name known to ``timm.list_models()``, e.g. ``'deit_tiny_patch16_224'``.
        num_classes: number of classes of the classifier head.
        pretrained_file: a local timm checkpoint to start from; a head of another size is
            dropped and re-initialised, as timm does for fine-tuning.
        label_smoothing: label smoothing of the cross-entropy, in ``[0, 1)``.
        grad_checkpointing: checkpoint each block, as timm's ``set_grad_checkpointing()`` does
            (the simple recipe's per-block checkpointing; DropIT layers select once inside,
            compressed modules and offload hand what they save to the checkpoint).
        data_preprocessor: config of the batch preprocessor (default ``ClsDataPreprocessor``).
        init_cfg: optional MMEngine weight initialisation; without it, timm's own
            initialisation (done at construction) is kept.
        **timm_kwargs: passed to ``timm.create_model`` (``img_size``, ``in_chans``, ``depth``,
            ``drop_path_rate``, ...).
    """

    def __init__(self,
                 model_name: str,
                 num_classes: int,
                 pretrained_file: str | None = None,
                 label_smoothing: float = 0.0,
                 grad_checkpointing: bool = False,
                 data_preprocessor: dict | None = None,
                 init_cfg: dict | list | None = None,
                 **timm_kwargs: Any) -> None:
        super().__init__(
            data_preprocessor=data_preprocessor or dict(type='ClsDataPreprocessor'),
            init_cfg=init_cfg)
        if not 0.0 <= label_smoothing < 1.0:
            raise ConfigError(f'label_smoothing must be in [0, 1), got {label_smoothing}')
        if model_name not in timm.list_models():
            close = difflib.get_close_matches(model_name, timm.list_models(), n=5)
            hint = f'close names: {", ".join(close)}' if close else \
                "timm.list_models('vit_*') lists the ViTs, for example"
            raise ConfigError(f'timm has no model {model_name!r}; {hint}')
        if pretrained_file is not None and not osp.isfile(pretrained_file):
            raise DataNotFoundError(
                f'pretrained_file {pretrained_file!r} does not exist: download the timm '
                'checkpoint to that path or set pretrained_file=None')
        self.label_smoothing = label_smoothing
        self.model = timm.create_model(
            model_name,
            pretrained=pretrained_file is not None,
            pretrained_cfg_overlay=dict(file=pretrained_file) if pretrained_file else None,
            num_classes=num_classes,
            **timm_kwargs)
        if grad_checkpointing:
            try:
                self.model.set_grad_checkpointing(True)
            except (AssertionError, NotImplementedError):
                raise ConfigError(f'timm model {model_name!r} has no per-block checkpointing: '
                                  'drop grad_checkpointing') from None

    def init_weights(self) -> None:
        """Apply ``init_cfg`` if given; timm's own initialisation is otherwise kept.

        MMEngine's default would call ``init_weights()`` of the timm network again, which
        re-draws the weights and would overwrite a ``pretrained_file``. A second call does
        nothing (as in MMEngine's ``BaseModule``): the FSDP wrappers initialise before sharding,
        and the runner's later call must not initialise the shards again.
        """
        if self.init_cfg and not self._is_init:
            initialize(self, self.init_cfg)
        self._is_init = True

    def forward(self,
                inputs: torch.Tensor,
                data_samples: list[BaseDataElement] | None = None,
                mode: str = 'tensor') -> Any:
        """Run in one of MMEngine's three modes.

        Args:
            inputs: a preprocessed batch ``[N, C, H, W]``.
            data_samples: one element per image with ``gt_label`` (needed for ``'loss'``).
            mode: ``'loss'`` returns ``{'loss': ...}``; ``'predict'`` returns the data samples
                with ``pred_score`` and ``pred_label``; ``'tensor'`` returns the logits.
        """
        logits = self.model(inputs)
        if mode == 'tensor':
            return logits
        if mode == 'loss':
            return {'loss': self.loss(logits, data_samples)}
        if mode == 'predict':
            return self.predict(logits, data_samples)
        raise ValueError(f'unknown mode {mode!r}; use "loss", "predict" or "tensor"')

    def loss(self, logits: torch.Tensor,
             data_samples: list[BaseDataElement] | None) -> torch.Tensor:
        """Cross-entropy of ``logits`` against the samples' soft ``gt_score`` (set by Mixup /
        CutMix, which carry their own label smoothing) or else their ``gt_label``."""
        if not data_samples:
            raise ValueError('mode="loss" needs data_samples with gt_label')
        if all('gt_score' in sample for sample in data_samples):
            scores = torch.stack([sample.gt_score for sample in data_samples]).to(logits.device)
            return torch.sum(-scores * logits.float().log_softmax(dim=-1), dim=-1).mean()
        target = torch.stack([sample.gt_label for sample in data_samples]).to(logits.device)
        return F.cross_entropy(logits.float(), target.view(-1),
                               label_smoothing=self.label_smoothing)

    @staticmethod
    def predict(logits: torch.Tensor,
                data_samples: list[BaseDataElement] | None) -> list[BaseDataElement]:
        """Attach softmax scores and the arg-max label to each sample."""
        scores = logits.float().softmax(dim=1).detach()
        if data_samples is None:
            data_samples = [BaseDataElement() for _ in range(len(scores))]
        for sample, score in zip(data_samples, scores):
            sample.set_field(score, 'pred_score')
            sample.set_field(score.argmax().view(1), 'pred_label')
        return data_samples
