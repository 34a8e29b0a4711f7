"""Mixed precision's configuration (:class:`MixedPrecisionConfig`): checked once, entered as one
context.

Mixed precision acts on a training step, not on a model: the configuration gives the autocast
context a step's forward pass runs in (:meth:`~MixedPrecisionConfig.autocast`) and the loss
scaler float16 needs (:meth:`~MixedPrecisionConfig.loss_scaler`). ``MixedPrecisionOptimWrapper``,
the memory budget's bf16 switch and the benchmark's autocast variants each make one.

Example:
    >>> config = MixedPrecisionConfig('bfloat16')
    >>> with config.autocast('cpu'):
    ...     (torch.ones(2, 2) @ torch.ones(2, 2)).dtype
    torch.bfloat16
    >>> MixedPrecisionConfig().dtype_on('cpu'), MixedPrecisionConfig().dtype_on('cuda')
    (torch.bfloat16, torch.float16)
    >>> MixedPrecisionConfig().describe('cuda')
    'float16 autocast on cuda with dynamic loss scaling'
    >>> MixedPrecisionConfig('half')
    Traceback (most recent call last):
    ...
    mmdropit.errors.ConfigError: mixed precision dtype must be 'float16' or 'bfloat16', got 'half'
"""
from __future__ import annotations

from collections.abc import Mapping
from dataclasses import InitVar, dataclass
from typing import ClassVar

import torch

from ..errors import ConfigError

DTYPES = {'float16': torch.float16, 'bfloat16': torch.bfloat16}
"""The autocast dtypes by name."""


def _dtype_name(dtype: object, where: str) -> str | None:
    """``dtype`` (``None``, a name or a ``torch.dtype``) as its name, checked."""
    if dtype is None:
        return None
    for name, value in DTYPES.items():
        if dtype == name or dtype is value:
            return name
    raise ConfigError(f"{where} dtype must be 'float16' or 'bfloat16', got {dtype!r}")


def _loss_scale(loss_scale: object, where: str) -> str | float | tuple[tuple[str, object], ...]:
    """``loss_scale`` checked; a dict kept as pairs, so that the configuration is hashable."""
    if loss_scale == 'dynamic':
        return loss_scale
    if isinstance(loss_scale, (int, float)) and not isinstance(loss_scale, bool):
        return loss_scale
    if isinstance(loss_scale, Mapping):
        return tuple(sorted(loss_scale.items()))
    if isinstance(loss_scale, tuple) and all(isinstance(pair, tuple) for pair in loss_scale):
        return loss_scale
    raise ConfigError(f"{where} loss_scale must be 'dynamic', a number (the initial scale) or "
                      f'a dict of GradScaler arguments, got {loss_scale!r}')


@dataclass(frozen=True)
class MixedPrecisionConfig:
    """Autocast to a lower precision in the forward pass, with loss scaling for float16.

    Args:
        dtype: ``'float16'`` or ``'bfloat16'`` (or the ``torch.dtype``); ``None`` takes
            float16 on GPUs and bfloat16 on CPUs.
        loss_scale: ``'dynamic'``, an initial scale (an int; a float is a fixed scale, as in
            MMEngine's ``AmpOptimWrapper``), or a dict of ``torch.amp.GradScaler`` arguments.
            Used with float16 only: bfloat16 has float32's exponent range.
        where: Who gives the values, to start error messages with (not stored).

    Raises:
        ConfigError: A dtype other than float16 / bfloat16, or a loss scale of another form.

    Config example::

        optim_wrapper = dict(type='MixedPrecisionOptimWrapper', dtype='bfloat16',
                             optimizer=dict(type='AdamW', lr=5e-4))
    """

    name: ClassVar[str] = 'mixed_precision'
    lossy: ClassVar[bool] = True

    dtype: str | None = None
    loss_scale: str | float | tuple[tuple[str, object], ...] = 'dynamic'
    where: InitVar[str] = 'mixed precision'

    def __post_init__(self, where: str) -> None:
        object.__setattr__(self, 'dtype', _dtype_name(self.dtype, where))
        object.__setattr__(self, 'loss_scale', _loss_scale(self.loss_scale, where))

    def dtype_on(self, device_type: str) -> torch.dtype:
        """The autocast dtype on ``device_type`` (``'cpu'``, ``'cuda'``).

        Raises:
            ConfigError: bfloat16 on a GPU that has none.
        """
        if self.dtype is None:
            return torch.float16 if device_type == 'cuda' else torch.bfloat16
        if self.dtype == 'bfloat16' and device_type == 'cuda' and \
                not torch.cuda.is_bf16_supported():
            raise ConfigError("this GPU has no bfloat16: use dtype='float16'")
        return DTYPES[self.dtype]

    def autocast(self, device_type: str) -> torch.autocast:
        """The context a step's forward pass runs in on ``device_type``."""
        return torch.autocast(device_type, dtype=self.dtype_on(device_type))

    def loss_scaler(self, device_type: str, use_fsdp: bool = False) -> torch.amp.GradScaler:
        """The loss scaler of a step on ``device_type``, enabled for float16 only (the sharded
        one under FSDP)."""
        if use_fsdp:
            from torch.distributed.fsdp.sharded_grad_scaler import \
                ShardedGradScaler as scaler_type
        else:
            scaler_type = torch.amp.GradScaler
        if self.loss_scale == 'dynamic':
            options = {}
        elif isinstance(self.loss_scale, tuple):
            options = dict(self.loss_scale)
        else:
            options = dict(init_scale=float(self.loss_scale))
        enabled = self.dtype_on(device_type) is torch.float16
        return scaler_type(device_type, enabled=enabled, **options)

    def describe(self, device_type: str) -> str:
        """What the configuration does on ``device_type``, for logs (e.g. ``'bfloat16
        autocast on cpu, no loss scaling'``)."""
        dtype = str(self.dtype_on(device_type)).removeprefix('torch.')
        if dtype == 'bfloat16':
            return f'{dtype} autocast on {device_type}, no loss scaling'
        scale = 'dynamic' if self.fixed_scale is None else 'fixed'
        return f'{dtype} autocast on {device_type} with {scale} loss scaling'

    @property
    def fixed_scale(self) -> float | None:
        """The loss scale every step is set back to (a float ``loss_scale``), else ``None``."""
        return self.loss_scale if isinstance(self.loss_scale, float) else None

    def to_json(self) -> dict:
        loss_scale = dict(self.loss_scale) if isinstance(self.loss_scale, tuple) else \
            self.loss_scale
        return dict(dtype=self.dtype, loss_scale=loss_scale)
