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
from mmengine.optim import AmpOptimWrapper, OptimWrapper
from mmengine.registry import OPTIM_WRAPPERS
from torch import nn

from ...errors import ConfigError
from .micro_batching import MicroBatching

_DTYPES = {'float16': torch.float16, 'bfloat16': torch.bfloat16}


def _device_type() -> str:
    """Where the runner trains: MMEngine moves models to CUDA whenever it is available."""
    return 'cuda' if torch.cuda.is_available() else 'cpu'


def _resolve_dtype(dtype: str | torch.dtype | None, device_type: str) -> torch.dtype:
    if dtype is None:
        return torch.float16 if device_type == 'cuda' else torch.bfloat16
    resolved = _DTYPES.get(dtype) if isinstance(dtype, str) else dtype
    if resolved not in _DTYPES.values():
        raise ConfigError(f"mixed precision dtype must be 'float16' or 'bfloat16', got {dtype!r}")
    if resolved is torch.bfloat16 and device_type == 'cuda' and not torch.cuda.is_bf16_supported():
        raise ConfigError("this GPU has no bfloat16: use dtype='float16'")
    return resolved


def _loss_scaler(loss_scale: str | float | dict, device_type: str, enabled: bool,
                 use_fsdp: bool) -> torch.amp.GradScaler:
    if use_fsdp:
        from torch.distributed.fsdp.sharded_grad_scaler import ShardedGradScaler as scaler_type
    else:
        scaler_type = torch.amp.GradScaler
    if loss_scale == 'dynamic':
        options = {}
    elif isinstance(loss_scale, (int, float)) and not isinstance(loss_scale, bool):
        options = dict(init_scale=float(loss_scale))
    elif isinstance(loss_scale, dict):
        options = dict(loss_scale)
    else:
        raise ConfigError("loss_scale must be 'dynamic', a number (the initial scale) or a dict "
                          f'of GradScaler arguments, got {loss_scale!r}')
    return scaler_type(device_type, enabled=enabled, **options)


@OPTIM_WRAPPERS.register_module()
class MixedPrecisionOptimWrapper(MicroBatching, AmpOptimWrapper):
    """Automatic mixed precision on the training device (CPU or GPU), optionally micro-batched.

    Args:
        dtype: ``'float16'`` or ``'bfloat16'``; ``None`` takes float16 on GPUs and bfloat16 on
            CPUs. Loss scaling is on for float16 only (bfloat16 has float32's exponent range).
        loss_scale: ``'dynamic'``, an initial scale, or a dict of ``torch.amp.GradScaler``
            arguments (float16 only).
        use_fsdp: Use the sharded loss scaler (training under FSDP).
        micro_batches: As in :class:`MicroBatchOptimWrapper`.
        memory_budget: As in :class:`MicroBatchOptimWrapper`.
        **kwargs: ``OptimWrapper`` arguments (``optimizer``, ``accumulative_counts``,
            ``clip_grad``).

    Raises:
        ConfigError: A dtype other than float16 / bfloat16, or bfloat16 on a GPU without it.
    """

    def __init__(self, dtype: str | torch.dtype | None = None,
                 loss_scale: str | float | dict = 'dynamic', use_fsdp: bool = False,
                 micro_batches: int | None = None, memory_budget: object = None,
                 **kwargs) -> None:
        OptimWrapper.__init__(self, **kwargs)  # AmpOptimWrapper.__init__ insists on a GPU
        self.configure_micro_batching(micro_batches, memory_budget)
        self.device_type = _device_type()
        self.cast_dtype = _resolve_dtype(dtype, self.device_type)
        scaled = self.cast_dtype is torch.float16
        self.loss_scaler = _loss_scaler(loss_scale, self.device_type, scaled, use_fsdp)
        self._scale_update_param = (float(loss_scale) if scaled and isinstance(loss_scale, float)
                                    else None)

    def step(self, **kwargs) -> None:
        """The loss-scaled update of ``AmpOptimWrapper``; with float16, the scale it leaves is
        logged as ``loss_scale`` (it halves after each step with non-finite gradients)."""
        super().step(**kwargs)
        if self.loss_scaler.is_enabled():
            self.message_hub.update_scalar('train/loss_scale', self.loss_scaler.get_scale())

    @contextlib.contextmanager
    def optim_context(self, model: nn.Module) -> Iterator[None]:
        """Gradient-sync control of ``OptimWrapper`` plus autocast to :attr:`cast_dtype`."""
        with OptimWrapper.optim_context(self, model), \
                torch.autocast(self.device_type, dtype=self.cast_dtype):
            yield
