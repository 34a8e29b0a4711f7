"""One entry to the integer codecs by bit width: 8 bits (:mod:`.int8`, rounded to the nearest
step) and 4 or 2 bits (:mod:`.low_bit`, rounded stochastically).

A 1-D tensor of values becomes a tuple of compact tensors (saved for backward as they are) and
comes back from them; the bit width and the value count say how to read the tuple.

Example:
    >>> values = torch.randn(100)
    >>> [(bits, quantized_values_bytes(100, bits)) for bits in BITS]   # fp32: 400 bytes
    [(8, 116), (4, 96), (2, 64)]
    >>> codes = quantize_values(values, 4)
    >>> dequantize_values(codes, 4, 100, torch.float32).shape
    torch.Size([100])
"""
from __future__ import annotations

import torch

from ..errors import ConfigError
from .int8 import GROUP, dequantize, quantize, quantized_bytes
from .low_bit import LOW_BITS, dequantize_low, low_bit_bytes, quantize_low

BITS = (8, *LOW_BITS)
"""The bit widths built."""


def check_bits(bits: object, where: str) -> int:
    """Return ``bits`` if it is one of :data:`BITS`.

    Raises:
        ConfigError: For anything else, naming ``where`` it was given.
    """
    if isinstance(bits, bool) or bits not in BITS:
        raise ConfigError(f'{where} takes 8 (int8, a scale per {GROUP} values), 4 or 2 (a '
                          f'minimum and step per {GROUP} values, stochastic rounding); '
                          f'got {bits!r}')
    return bits


def quantized_values_bytes(numel: int, bits: int) -> int:
    """Bytes of ``numel`` values quantized to ``bits`` bits, with their groups' parameters."""
    return quantized_bytes(numel) if bits == 8 else low_bit_bytes(numel, bits)


def quantize_values(values: torch.Tensor, bits: int) -> tuple[torch.Tensor, ...]:
    """The 1-D ``values`` in ``bits`` bits, as the tensors :func:`dequantize_values` reads."""
    return quantize(values) if bits == 8 else quantize_low(values, bits)


def dequantize_values(codes: tuple[torch.Tensor, ...], bits: int, numel: int,
                      dtype: torch.dtype) -> torch.Tensor:
    """The ``numel`` values that :func:`quantize_values` encoded in ``bits`` bits, in ``dtype``."""
    if bits == 8:
        return dequantize(*codes, dtype)
    return dequantize_low(*codes, bits, numel, dtype)


def code_parts(numel: int, bits: int) -> tuple[tuple[torch.dtype, int], ...]:
    """The dtype and element count of each tensor :func:`quantize_values` returns for
    ``numel`` values in ``bits`` bits.

    Example:
        >>> code_parts(100, 8)   # int8 codes and a float32 scale per group of 32
        ((torch.int8, 100), (torch.float32, 4))
    """
    groups = -(-numel // GROUP)
    if bits == 8:
        return (torch.int8, numel), (torch.float32, groups)
    return ((torch.uint8, groups * GROUP * bits // 8), (torch.float32, groups),
            (torch.float32, groups))
