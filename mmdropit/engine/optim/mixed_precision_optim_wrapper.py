"""``MixedPrecisionOptimWrapper``: automatic mixed precision on CPUs and GPUs, with micro-batching.

mmengine 0.10.7's ``AmpOptimWrapper`` refuses to build without a GPU. This subclass runs
``torch.autocast`` on whichever device the runner trains on: bfloat16 on CPUs (the default there),
float16 with dynamic loss scaling or bfloat16 on GPUs. Under FSDP (``use_fsdp=True``) the loss
scaler is the sharded one. DropIT layers store their kept inputs in the autocast dtype.

Config example::

    optim_wrapper = dict(
        type='MixedPrecisionOptimWrapper', dtype='bfloat16',  # None: fp16 on GPU, bf16 on CPU
        micro_batches=4,                                      # optional: MicroBatchOptimWrapper
        optimizer=dict(type='AdamW', lr=5e-4, weight_decay=0.05))

``tools/train.py --amp`` turns ``OptimWrapper``, ``AmpOptimWrapper`` and ``MicroBatchOptimWrapper``
into this wrapper, keeping their arguments.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

import torch
from mmengine.logging import print_log
from mmengine.optim import AmpOptimWrapper, OptimWrapper
from mmengine.registry import OPTIM_WRAPPERS
from torch import nn

from ...microbatch import MicroBatchConfig
from ...precision import MixedPrecisionConfig
from .micro_batching import MicroBatching

def _device_type() -> str:
    """Where the runner trains: MMEngine moves models to CUDA whenever it is available."""
    return 'cuda' if torch.cuda.is_available() else 'cpu'


@OPTIM_WRAPPERS.register_module()
class MixedPrecisionOptimWrapper(MicroBatching, AmpOptimWrapper):
    """Automatic mixed precision on the training device (CPU or GPU), optionally micro-batched.

    Args:
        dtype: As in :class:`~mmdropit.precision.MixedPrecisionConfig`: ``'float16'`` or
            ``'bfloat16'``; ``None`` takes float16 on GPUs and bfloat16 on CPUs.
        loss_scale: As in :class:`~mmdropit.precision.MixedPrecisionConfig` (float16 only).
        use_fsdp: Use the sharded loss scaler (training under FSDP).
        micro_batches: As in :class:`MicroBatchOptimWrapper`.
        memory_budget: As in :class:`MicroBatchOptimWrapper`.
        **kwargs: ``OptimWrapper`` arguments (``optimizer``, ``accumulative_counts``,
            ``clip_grad``).

    Raises:
        ConfigError: A dtype other than float16 / bfloat16, or bfloat16 on a GPU without it.

    Attributes:
        precision: The configuration, checked once.
        cast_dtype: Its autocast dtype on the training device.
    """

    def __init__(self, dtype: str | torch.dtype | None = None,
                 loss_scale: str | float | dict = 'dynamic', use_fsdp: bool = False,
                 micro_batches: int | None = None, memory_budget: object = None,
                 **kwargs) -> None:
        OptimWrapper.__init__(self, **kwargs)  # AmpOptimWrapper.__init__ insists on a GPU
        self.configure_micro_batching(MicroBatchConfig(micro_batches, memory_budget))
        self.precision = MixedPrecisionConfig(dtype, loss_scale, where='mixed precision')
        self.device_type = _device_type()
        self.cast_dtype = self.precision.dtype_on(self.device_type)
        self.loss_scaler = self.precision.loss_scaler(self.device_type, use_fsdp)
        self._scale_update_param = self.precision.fixed_scale if \
            self.loss_scaler.is_enabled() else None
        print_log(f'mixed precision: {self.precision.describe(self.device_type)}',
                  logger='current')

    def step(self, **kwargs) -> None:
        """The loss-scaled update of ``AmpOptimWrapper``; with float16, the scale it leaves is
        logged as ``loss_scale`` (it halves after each step with non-finite gradients)."""
        super().step(**kwargs)
        if self.loss_scaler.is_enabled():
            self.message_hub.update_scalar('train/loss_scale', self.loss_scaler.get_scale())

    @contextlib.contextmanager
    def optim_context(self, model: nn.Module) -> Iterator[None]:
        """Gradient-sync control of ``OptimWrapper`` plus autocast to :attr:`cast_dtype`."""
        with OptimWrapper.optim_context(self, model), self.precision.autocast(self.device_type):
            yield
