"""DropIT's kept values in 8, 4 or 2 bits, with the per-group codecs of :mod:`mmdropit.codecs`.

With ``value_bits=8`` a DropIT layer stores each kept value as an int8 code with a float32 scale
per :data:`~mmdropit.codecs.int8.GROUP` consecutive kept values (in memory order): at gamma 0.9
an fp32 input then shrinks to 0.059 of its size (bitmask + codes + scales) instead of 0.13, a
bf16 one to 0.12 instead of 0.16. With ``value_bits=4`` (or 2) each group keeps its minimum and
step and the values are rounded stochastically (:mod:`mmdropit.codecs.low_bit`): 0.050 (0.044)
of an fp32 input. The weight gradient is computed from the rebuilt values, the input and bias
gradients stay exact.
"""
from __future__ import annotations

import dataclasses

import torch

from ..codecs.bits import (BITS, check_bits, dequantize_values, quantize_values,
                           quantized_values_bytes)
from .layout import CompactLayout

VALUE_BITS = (None, *BITS)
"""The accepted ``value_bits``: ``None`` keeps the values in the input's dtype."""


def check_value_bits(value_bits: object, where: str = 'value_bits') -> int | None:
    """Return ``value_bits`` if it is ``None`` (values in the input's dtype) or one of
    :data:`mmdropit.codecs.bits.BITS`.

    Raises:
        ConfigError: For anything else.
    """
    return None if value_bits is None else check_bits(value_bits, f'{where} (or None)')


def quantize_kept(tensors: tuple[torch.Tensor, ...], layout: CompactLayout,
                  bits: int) -> tuple[tuple[torch.Tensor, ...], CompactLayout]:
    """Compact tensors ``(bitmask or indices, values)`` with their values in ``bits`` bits:
    ``(bitmask or indices, *codes)`` and the layout that says so."""
    first, values = tensors
    nbytes = (layout.nbytes - values.numel() * values.element_size()
              + quantized_values_bytes(values.numel(), bits))
    return ((first, *quantize_values(values, bits)),
            dataclasses.replace(layout, value_bits=bits, value_count=values.numel(),
                                nbytes=nbytes))


def dequantize_kept(tensors: tuple[torch.Tensor, ...],
                    layout: CompactLayout) -> tuple[torch.Tensor, ...]:
    """Undo :func:`quantize_kept` (tensors with values in their dtype are returned as they
    are)."""
    if layout.value_bits is None:
        return tensors
    first, *codes = tensors
    return first, dequantize_values(tuple(codes), layout.value_bits, layout.value_count,
                                    layout.dtype)
