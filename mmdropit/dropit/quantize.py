"""DropIT's kept values in 8 bits: one scale per group of values, as Mesa stores activations.

With ``value_bits=8`` a DropIT layer stores each kept value as an int8 ``round(v / s)`` with
``s = max|v| / 127`` over its group of :data:`GROUP` consecutive kept values (in memory order),
plus one float32 scale per group: ``kept * (1 + 4 / GROUP)`` bytes instead of
``kept * element_size``. At gamma 0.9 an fp32 input then shrinks to 0.057 of its size (bitmask
+ int8 values + scales) instead of 0.13, a bf16 one to 0.11 instead of 0.16. Rounding to the
nearest step errs by at most half a step, ``max|v| / 254`` of its group; the weight gradient is
computed from the rebuilt values, the input and bias gradients stay exact.

Example:
    >>> values = torch.tensor([0.5, -1.0, 0.25, 2.0])
    >>> codes, scales = quantize(values)
    >>> codes.tolist(), round(scales.item() * 127, 4)   # one group: its scale is max|v| / 127
    ([32, -64, 16, 127], 2.0)
    >>> (dequantize(codes, scales, torch.float32) - values).abs().max() <= 2.0 / 254
    tensor(True)
"""
from __future__ import annotations

import dataclasses
import math
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F

from ..errors import ConfigError

if TYPE_CHECKING:
    from .compact import CompactLayout

GROUP = 128
"""Kept values that share one scale."""
VALUE_BITS = (None, 8)
"""The accepted ``value_bits``: ``None`` keeps the values in the input's dtype."""


def check_value_bits(value_bits: object, where: str = 'value_bits') -> int | None:
    """Return ``value_bits`` if it is ``None`` or 8.

    Raises:
        ConfigError: For anything else.
    """
    if value_bits is not None and (isinstance(value_bits, bool) or value_bits != 8):
        raise ConfigError(f'{where} must be None (values in the input dtype) or 8 (int8 with a '
                          f'scale per {GROUP} values); got {value_bits!r}')
    return value_bits


def quantized_bytes(kept: int) -> int:
    """Bytes of ``kept`` values in 8 bits with their scales.

    Example:
        >>> quantized_bytes(1000)   # 1000 codes + 8 float32 scales
        1032
    """
    return kept + 4 * math.ceil(kept / GROUP)


def _groups(values: torch.Tensor) -> torch.Tensor:
    return F.pad(values, (0, -values.numel() % GROUP)).view(-1, GROUP)


def quantize(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(codes, scales)``: int8 codes of the 1-D ``values`` and a float32 scale per group."""
    groups = _groups(values.float())
    scales = groups.abs().amax(1).clamp_min(torch.finfo(torch.float32).tiny) / 127
    codes = (groups / scales[:, None]).round_().to(torch.int8)
    return codes.view(-1)[:values.numel()].clone(), scales  # not a view of the padded groups


def dequantize(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The values that :func:`quantize` encoded, in ``dtype``."""
    values = _groups(codes).float() * scales[:, None]
    return values.view(-1)[:codes.numel()].to(dtype)


def quantize_kept(tensors: tuple[torch.Tensor, ...],
                  layout: CompactLayout) -> tuple[tuple[torch.Tensor, ...], CompactLayout]:
    """Compact tensors ``(bitmask or indices, values)`` with their values in 8 bits:
    ``(bitmask or indices, codes, scales)`` and the layout that says so."""
    first, values = tensors
    codes, scales = quantize(values)
    nbytes = (layout.nbytes - values.numel() * values.element_size()
              + quantized_bytes(values.numel()))
    return (first, codes, scales), dataclasses.replace(layout, value_bits=8, nbytes=nbytes)


def dequantize_kept(tensors: tuple[torch.Tensor, ...],
                    layout: CompactLayout) -> tuple[torch.Tensor, ...]:
    """Undo :func:`quantize_kept` (tensors without 8-bit values are returned as they are)."""
    if layout.value_bits is None:
        return tensors
    first, codes, scales = tensors
    return first, dequantize(codes, scales, layout.dtype)
