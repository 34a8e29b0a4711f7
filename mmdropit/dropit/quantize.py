"""DropIT's kept values in 8 bits, with the per-group int8 codec (:mod:`mmdropit.codecs.int8`).

With ``value_bits=8`` a DropIT layer stores each kept value as an int8 code with a float32 scale
per :data:`~mmdropit.codecs.int8.GROUP` consecutive kept values (in memory order): at gamma 0.9
an fp32 input then shrinks to 0.059 of its size (bitmask + codes + scales) instead of 0.13, a
bf16 one to 0.12 instead of 0.16. The weight gradient is computed from the rebuilt values, the
input and bias gradients stay exact.
"""
from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

import torch

from ..codecs.int8 import GROUP, dequantize, quantize, quantized_bytes
from ..errors import ConfigError

if TYPE_CHECKING:
    from .compact import CompactLayout

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
