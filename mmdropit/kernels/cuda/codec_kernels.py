"""The activation codes' fused GPU kernels, written in Triton: the same operations as the CPU
extension's (the integer codecs' ``quantize_int8``, ``dequantize_int8``, ``quantize_low``,
``dequantize_low``; the lean activations' ``pack_between``, ``where_bits``, ``bucket_codes``,
``scale_by_codes``), giving the same tensors bit for bit.

Each Triton program takes :data:`GROUPS` groups of :data:`GROUP`
consecutive values (a ``[GROUPS, GROUP]`` block, loaded contiguously), reduces each group in
registers and writes its codes and parameters; the last group is partial when the value count
is not a multiple of the group. Every output size follows from the shape, and nothing is read
back to the host.

- ``quantize_int8``: per group ``scale = max(max|v|, tiny) * float32(1 / 127)`` and codes
  ``round(v / scale)`` (to the nearest, ties to even), as :func:`mmdropit.codecs.int8.quantize`.
  One launch; reads the input's element size per value, writes 1 + 4/32 bytes per value.
- ``dequantize_int8``: ``code * scale`` in the output dtype. One launch; reads 1 + 4/32 bytes,
  writes the output's element size per value.
- ``quantize_low``: per group (the last padded with its last value) minimum, step
  ``max(max - min, tiny) * float32(1 / (2**bits - 1))`` and codes ``floor((v - min) / step + u)``
  clamped to the levels, packed ``8 / bits`` a byte, the first in the lowest bits. ``u`` is the
  CPU kernel's counter-based hash of the element's index keyed by a 64-bit seed
  (``low_bit_kernels.cpp``, ``uniform_at``), reproduced here in 32-bit unsigned arithmetic: the
  same seed gives the same codes on both devices. The seed is a one-element int64 tensor on the
  device, read by the kernel. One launch (the codec's entry point,
  :func:`mmdropit.codecs.low_bit.quantize_low`, adds one: the seed's draw from the plugin's
  generator, on the device); reads the element size per value, writes ``bits / 8 + 8/32``
  bytes per value (and reads the seed's 8 bytes once a program).
- ``dequantize_low``: ``code * step + minimum`` (multiplied, then added: compiled without fused
  multiply-add, as the eager path rounds). One launch; reads ``bits / 8 + 8/32`` bytes per
  value, writes the output's element size.

The lean activations' 1-bit masks (:mod:`mmdropit.dropit.lean_activations`), the CPU
extension's ``pack_between`` and ``where_bits``, :data:`MASK_BLOCK` values a program:

- ``pack_between``: bit ``i`` is ``low < x_i`` (and ``x_i < high`` when bounded), 8 a byte,
  element ``i`` at bit ``i % 8``; the bounds are rounded to the input's dtype in the kernel,
  as PyTorch compares a tensor with a number. One launch; reads the element
  size per value, writes 1/8 byte.
- ``where_bits``: the gradient where the bit is set, zero elsewhere. One launch; reads the
  element size and 1/8 byte per value, writes the element size.

The lean GELU / SiLU's 4-bit derivative codes (:mod:`mmdropit.codecs.derivative_codes`), the
CPU extension's ``bucket_codes`` and ``scale_by_codes``, :data:`MASK_BLOCK` values a program:

- ``bucket_codes``: code ``i`` is how many of the (at most 15) ascending boundaries lie below
  ``x_i``, a NaN after all of them, as ``torch.bucketize`` places it; two a byte, element
  ``2k`` in the low four bits. One launch; reads the element size per value, writes 1/2 byte.
- ``scale_by_codes``: ``grad_i * table[code_i]`` in the gradient's dtype (the product rounded
  once, as PyTorch's). One launch; reads the element size and 1/2 byte per value, writes the
  element size.

On an H200 (2026-11-26, docs/results/2026-11-26/gpu_h200_frontier_kernels) the int8 kernels
ran at 0.24-1.02 (encode) and 0.33-0.94 (decode) of a copy's bandwidth, at bandwidth from about
40 M values; the 4/2-bit and mask kernels are not timed yet.
Scales and steps are products by a float32 reciprocal, as the eager path and the CPU kernels
compute them (a quotient would match eager on the CPU only: PyTorch divides a CUDA tensor by a
number with its reciprocal); the divisions by them are IEEE (``div_rn``), and rounding to the
nearest uses the float32 addition of ``1.5 * 2**23``, exact for the codes' range. Inputs of
2**31 elements or more and float64 inputs stay on the eager path
(:func:`~.library.codecs_usable`); a decoder is chosen by its float32 parameters, so it also
writes the float64 values of an eagerly encoded input.

Example (on a GPU; with ``TRITON_INTERPRET=1``, as the tests run it, on CPU tensors too):
    >>> device = 'cuda' if torch.cuda.is_available() else 'cpu'
    >>> codes, scales = quantize_int8(torch.tensor([0.5, -1.0, 0.25, 2.0], device=device))
    >>> codes.tolist(), dequantize_int8(codes, scales, torch.float32).tolist()[3]
    ([32, -64, 16, 127], 2.0)
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from .grid import ceil_div

GROUP = 32
"""Values sharing a scale (or a minimum and a step): the codecs' ``GROUP`` and the CPU kernels'
``kGroup``, which ``kernels`` sits below and does not import (the bit-identity tests against
the eager codecs fail if they differ)."""
GROUPS = 32
"""Groups per Triton program (1024 values)."""
MASK_BLOCK = 1024
"""Values per Triton program of the 1-bit masks (a multiple of 8: whole bytes)."""
_ROUNDING = tl.constexpr(12582912.0)  # 1.5 * 2**23: adding, subtracting it rounds to even


def _grid(groups: int) -> tuple[int]:
    return (ceil_div(groups, GROUPS),)


@triton.jit
def _group_offsets(GROUP: tl.constexpr, GROUPS: tl.constexpr):
    """The program's group indices ``[GROUPS, 1]`` and element indices ``[GROUPS, GROUP]``."""
    groups = tl.program_id(0).to(tl.int64) * GROUPS + tl.arange(0, GROUPS)[:, None]
    return groups, groups * GROUP + tl.arange(0, GROUP)[None, :]


@triton.jit
def _quantize_int8_kernel(x_ptr, codes_ptr, scales_ptr, numel, group_count,
                          GROUP: tl.constexpr, GROUPS: tl.constexpr):
    groups, offsets = _group_offsets(GROUP, GROUPS)
    inside = offsets < numel
    values = tl.load(x_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
    largest = tl.max(tl.abs(values), axis=1)
    # times float32(1 / 127), not divided: the eager path's and the CPU kernel's product
    scales = tl.maximum(largest, 1.1754943508222875e-38) * tl.full([], 1.0 / 127.0, tl.float32)
    quotients = tl.div_rn(values, scales[:, None])
    rounded = (quotients + _ROUNDING) - _ROUNDING
    tl.store(codes_ptr + offsets, rounded.to(tl.int8), mask=inside)
    tl.store(scales_ptr + tl.reshape(groups, [GROUPS]), scales,
             mask=tl.reshape(groups, [GROUPS]) < group_count)


@triton.jit
def _dequantize_int8_kernel(codes_ptr, scales_ptr, out_ptr, numel,
                            GROUP: tl.constexpr, GROUPS: tl.constexpr):
    groups, offsets = _group_offsets(GROUP, GROUPS)
    inside = offsets < numel
    codes = tl.load(codes_ptr + offsets, mask=inside, other=0).to(tl.float32)
    scales = tl.load(scales_ptr + groups, mask=groups * GROUP < numel, other=0.0)
    rebuilt = rounded_to(codes * scales, out_ptr.dtype.element_ty)
    tl.store(out_ptr + offsets, rebuilt, mask=inside)


@triton.jit
def rounded_to(values, DTYPE: tl.constexpr):
    """float32 ``values`` rounded to ``DTYPE``, to the nearest (ties to even). A bfloat16 is
    rounded by its bit pattern: Triton's interpreter truncates that conversion, the GPU rounds
    it to the nearest, and both then agree with PyTorch's."""
    if DTYPE == tl.bfloat16:
        pattern = values.to(tl.uint32, bitcast=True)
        pattern = (pattern + 0x7FFF + ((pattern >> 16) & 1)) >> 16
        return pattern.to(tl.uint16).to(tl.bfloat16, bitcast=True)
    return values.to(DTYPE)


@triton.jit
def _uniform_at(index, key_low, key_high):
    """The CPU kernel's ``uniform_at``: a number in [0, 1) from the 24 high bits of a murmur3
    finaliser over the int64 ``index``, keyed by the seed's two 32-bit halves."""
    low = (index & 0xFFFFFFFF).to(tl.uint32)
    high = (index >> 32).to(tl.uint32)
    h = (low * tl.full([], 0x9E3779B1, tl.uint32)) ^ key_low
    h ^= high * tl.full([], 0x85EBCA77, tl.uint32) + key_high
    h ^= h >> 16
    h *= tl.full([], 0x85EBCA6B, tl.uint32)
    h ^= h >> 13
    h *= tl.full([], 0xC2B2AE35, tl.uint32)
    h ^= h >> 16
    return (h >> 8).to(tl.float32) * (1.0 / 16777216.0)


@triton.jit
def _quantize_low_kernel(x_ptr, seed_ptr, packed_ptr, minimums_ptr, steps_ptr, numel,
                         group_count, BITS: tl.constexpr, GROUP: tl.constexpr,
                         GROUPS: tl.constexpr):
    groups, offsets = _group_offsets(GROUP, GROUPS)
    # the last group is padded with its last value; groups past the end read it too
    values = tl.load(x_ptr + tl.minimum(offsets, numel - 1)).to(tl.float32)
    low = tl.min(values, axis=1)
    high = tl.max(values, axis=1)
    levels: tl.constexpr = (1 << BITS) - 1
    # times float32(1 / levels), not divided: the eager path's and the CPU kernel's product
    steps = tl.maximum(high - low, 1.1754943508222875e-38) * tl.full([], 1.0 / levels, tl.float32)
    seed = tl.load(seed_ptr).to(tl.uint64, bitcast=True)
    key_low = (seed & 0xFFFFFFFF).to(tl.uint32)
    key_high = (seed >> 32).to(tl.uint32)
    uniform = _uniform_at(offsets, key_low, key_high)
    level = tl.floor(tl.div_rn(values - low[:, None], steps[:, None]) + uniform)
    codes = tl.minimum(tl.maximum(level, 0.0), levels * 1.0).to(tl.uint8)
    PER_BYTE: tl.constexpr = 8 // BITS
    lanes = tl.reshape(codes, [GROUPS, GROUP // PER_BYTE, PER_BYTE]).to(tl.int32)
    shifts = (tl.arange(0, PER_BYTE) * BITS)[None, None, :]
    packed = tl.sum(lanes << shifts, axis=2).to(tl.uint8)  # disjoint bits: the sum is an or
    in_range = groups < group_count
    bytes_at = groups * (GROUP // PER_BYTE) + tl.arange(0, GROUP // PER_BYTE)[None, :]
    tl.store(packed_ptr + bytes_at, packed, mask=in_range)
    flat_groups = tl.reshape(groups, [GROUPS])
    tl.store(minimums_ptr + flat_groups, low, mask=flat_groups < group_count)
    tl.store(steps_ptr + flat_groups, steps, mask=flat_groups < group_count)


@triton.jit
def _dequantize_low_kernel(packed_ptr, minimums_ptr, steps_ptr, out_ptr, numel,
                           BITS: tl.constexpr, GROUP: tl.constexpr, GROUPS: tl.constexpr):
    groups, offsets = _group_offsets(GROUP, GROUPS)
    inside = offsets < numel
    PER_BYTE: tl.constexpr = 8 // BITS
    packed = tl.load(packed_ptr + offsets // PER_BYTE, mask=inside, other=0).to(tl.int32)
    codes = ((packed >> ((offsets % PER_BYTE) * BITS).to(tl.int32)) & ((1 << BITS) - 1))
    in_range = groups * GROUP < numel
    steps = tl.load(steps_ptr + groups, mask=in_range, other=0.0)
    minimums = tl.load(minimums_ptr + groups, mask=in_range, other=0.0)
    scaled = codes.to(tl.float32) * steps
    rebuilt = rounded_to(scaled + minimums, out_ptr.dtype.element_ty)
    tl.store(out_ptr + offsets, rebuilt, mask=inside)


@triton.jit
def _pack_between_kernel(x_ptr, bits_ptr, numel, low, high, BOUNDED: tl.constexpr,
                         BLOCK: tl.constexpr):
    start = tl.program_id(0).to(tl.int64) * BLOCK
    offsets = start + tl.arange(0, BLOCK)
    inside = offsets < numel
    values = tl.load(x_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
    dtype: tl.constexpr = x_ptr.dtype.element_ty
    # compared in the input's dtype, as PyTorch compares a tensor with a number
    low_bound = rounded_to(tl.full([], low, tl.float32), dtype).to(tl.float32)
    passes = inside & (values > low_bound)
    if BOUNDED:
        high_bound = rounded_to(tl.full([], high, tl.float32), dtype).to(tl.float32)
        passes = passes & (values < high_bound)
    lanes = tl.reshape(passes.to(tl.int32), [BLOCK // 8, 8]) << tl.arange(0, 8)[None, :]
    packed = tl.sum(lanes, axis=1).to(tl.uint8)  # disjoint bits: the sum is an or
    byte_offsets = start // 8 + tl.arange(0, BLOCK // 8)
    tl.store(bits_ptr + byte_offsets, packed, mask=byte_offsets < (numel + 7) // 8)


@triton.jit
def _where_bits_kernel(grad_ptr, bits_ptr, out_ptr, numel, BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < numel
    grad = tl.load(grad_ptr + offsets, mask=inside, other=0.0)
    packed = tl.load(bits_ptr + offsets // 8, mask=inside, other=0).to(tl.int32)
    passes = ((packed >> (offsets % 8).to(tl.int32)) & 1) != 0
    tl.store(out_ptr + offsets, tl.where(passes, grad, tl.zeros_like(grad)), mask=inside)


@triton.jit
def _bucket_codes_kernel(x_ptr, bounds_ptr, packed_ptr, numel, COUNT: tl.constexpr,
                         BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < numel
    values = tl.load(x_ptr + offsets, mask=inside, other=0.0).to(tl.float32)
    at_or_below = tl.zeros([BLOCK], dtype=tl.int32)
    for index in tl.static_range(COUNT):
        at_or_below += (values <= tl.load(bounds_ptr + index).to(tl.float32)).to(tl.int32)
    # a NaN is at or below none: code COUNT, as bucketize gives; past the end: 0 (a zero pad)
    codes = tl.where(inside, COUNT - at_or_below, 0)
    pairs = tl.reshape(codes, [BLOCK // 2, 2]) << (4 * tl.arange(0, 2))[None, :]
    packed = tl.sum(pairs, axis=1).to(tl.uint8)  # disjoint bits: the sum is an or
    byte_offsets = tl.program_id(0).to(tl.int64) * (BLOCK // 2) + tl.arange(0, BLOCK // 2)
    tl.store(packed_ptr + byte_offsets, packed, mask=byte_offsets < (numel + 1) // 2)


@triton.jit
def _scale_by_codes_kernel(grad_ptr, packed_ptr, table_ptr, out_ptr, numel,
                           BLOCK: tl.constexpr):
    offsets = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < numel
    grad = tl.load(grad_ptr + offsets, mask=inside, other=0.0)
    packed = tl.load(packed_ptr + offsets // 2, mask=inside, other=0).to(tl.int32)
    codes = (packed >> (4 * (offsets % 2)).to(tl.int32)) & 15
    slope = tl.load(table_ptr + codes, mask=inside, other=0.0)
    product = rounded_to(grad.to(tl.float32) * slope.to(tl.float32), grad.dtype)
    tl.store(out_ptr + offsets, product, mask=inside)


def quantize_int8(flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(codes, scales)`` of the contiguous 1-D ``flat``: int8 codes and a float32 scale per
    group."""
    numel = flat.numel()
    group_count = ceil_div(numel, GROUP)
    codes = torch.empty(numel, dtype=torch.int8, device=flat.device)
    scales = torch.empty(group_count, dtype=torch.float32, device=flat.device)
    if group_count:
        _quantize_int8_kernel[_grid(group_count)](flat, codes, scales, numel, group_count,
                                                  GROUP=GROUP, GROUPS=GROUPS)
    return codes, scales


def dequantize_int8(codes: torch.Tensor, scales: torch.Tensor,
                    dtype: torch.dtype) -> torch.Tensor:
    """The values :func:`quantize_int8` encoded, in ``dtype``."""
    numel = codes.numel()
    out = torch.empty(numel, dtype=dtype, device=codes.device)
    if numel:
        _dequantize_int8_kernel[_grid(scales.numel())](codes, scales, out, numel,
                                                       GROUP=GROUP, GROUPS=GROUPS)
    return out


def quantize_low(flat: torch.Tensor, bits: int,
                 seed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(packed, minimums, steps)`` of the contiguous 1-D ``flat`` in ``bits`` bits (4 or 2),
    rounded stochastically with the uniform numbers of ``seed`` (a one-element int64 tensor on
    ``flat``'s device)."""
    if bits not in (4, 2):
        raise ValueError(f'quantize_low: bits must be 4 or 2, got {bits}')
    numel = flat.numel()
    group_count = ceil_div(numel, GROUP)
    packed = torch.empty(group_count * GROUP * bits // 8, dtype=torch.uint8, device=flat.device)
    minimums = torch.empty(group_count, dtype=torch.float32, device=flat.device)
    steps = torch.empty(group_count, dtype=torch.float32, device=flat.device)
    if group_count:
        _quantize_low_kernel[_grid(group_count)](flat, seed, packed, minimums, steps, numel,
                                                 group_count, BITS=bits, GROUP=GROUP,
                                                 GROUPS=GROUPS)
    return packed, minimums, steps


def dequantize_low(packed: torch.Tensor, minimums: torch.Tensor, steps: torch.Tensor, bits: int,
                   numel: int, dtype: torch.dtype) -> torch.Tensor:
    """The ``numel`` values :func:`quantize_low` encoded in ``bits`` bits, in ``dtype``."""
    out = torch.empty(numel, dtype=dtype, device=packed.device)
    if numel:
        _dequantize_low_kernel[_grid(minimums.numel())](packed, minimums, steps, out, numel,
                                                        BITS=bits, GROUP=GROUP, GROUPS=GROUPS,
                                                        enable_fp_fusion=False)
    return out


def pack_between(flat: torch.Tensor, low: float, high: float, bounded: bool) -> torch.Tensor:
    """The packed bits of ``low < flat`` (and ``flat < high`` when ``bounded``) for the
    contiguous 1-D ``flat``, the bounds compared in its dtype."""
    numel = flat.numel()
    bits = torch.empty((numel + 7) // 8, dtype=torch.uint8, device=flat.device)
    if numel:
        _pack_between_kernel[(ceil_div(numel, MASK_BLOCK),)](
            flat, bits, numel, low, high, BOUNDED=bounded, BLOCK=MASK_BLOCK)
    return bits


def where_bits(grad: torch.Tensor, bits: torch.Tensor) -> torch.Tensor:
    """The contiguous 1-D ``grad`` where the packed bit is set, zero elsewhere."""
    numel = grad.numel()
    out = torch.empty_like(grad)
    if numel:
        _where_bits_kernel[(ceil_div(numel, MASK_BLOCK),)](grad, bits, out, numel,
                                                           BLOCK=MASK_BLOCK)
    return out


def bucket_codes(flat: torch.Tensor, boundaries: torch.Tensor) -> torch.Tensor:
    """The 4-bit code of each element of the contiguous 1-D ``flat``, how many of the ascending
    ``boundaries`` (fewer than 16, in ``flat``'s dtype) lie below it, two a byte, the first in
    the low bits."""
    numel = flat.numel()
    packed = torch.empty((numel + 1) // 2, dtype=torch.uint8, device=flat.device)
    if numel:
        _bucket_codes_kernel[(ceil_div(numel, MASK_BLOCK),)](
            flat, boundaries, packed, numel, COUNT=boundaries.numel(), BLOCK=MASK_BLOCK)
    return packed


def scale_by_codes(grad: torch.Tensor, packed: torch.Tensor, table: torch.Tensor) -> torch.Tensor:
    """The contiguous 1-D ``grad`` times ``table[code]`` (16 values in ``grad``'s dtype) of the
    codes :func:`bucket_codes` packed."""
    numel = grad.numel()
    out = torch.empty_like(grad)
    if numel:
        _scale_by_codes_kernel[(ceil_div(numel, MASK_BLOCK),)](grad, packed, table, out,
                                                               numel, BLOCK=MASK_BLOCK)
    return out
