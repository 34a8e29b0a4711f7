"""Per-group 4- and 2-bit codes with stochastic rounding, as ActNN and GACT store activations.

Each group of :data:`~.int8.GROUP` consecutive values (in memory order) is mapped onto
``2**bits`` levels between its minimum and its maximum: ``step = (max - min) * float32(1 / L)``
with ``L = 2**bits - 1`` (a product by the float32 reciprocal, as the int8 codec's scale: every
device and kernel computes the same step bit for bit), and a value ``v`` becomes
``floor((v - min) / step + u)`` with ``u`` uniform in [0, 1), drawn from the plugin's own
generator (:mod:`mmdropit.common.random_source`). Rounding that way is
unbiased: over the draws, the rebuilt value's mean is ``v`` itself, so the gradients computed
from it are unbiased too; a single draw errs by less than one step. The codes are packed
``8 / bits`` to a byte, and each group keeps its minimum and step in float32:
``numel * bits / 8 + 8 * groups`` bytes, 0.19 of fp32 at 4 bits and 0.13 at 2 bits.

The encoding is a PyTorch custom operator, ``mmdropit::quantize_low``, with a fake (meta)
implementation: ``torch.compile`` calls it as an opaque kernel (its draws from a generator of
its own could not be traced) and keeps the graph whole.

On the CPU, when the fused kernels are built (:mod:`mmdropit.kernels.cpu`), both ways are one
pass of ``torch.ops.mmdropit_cpu`` (``quantize_low``, ``dequantize_low``); on a GPU, with
Triton, one launch each of :mod:`mmdropit.kernels.cuda.codec_kernels` (and the seed's draw,
kept on the device). Each value's uniform number is then a hash of its index keyed by a seed
drawn from the plugin's generator, the same hash on both devices, not a draw from the generator
itself, so the fused and the eager path round differently (both without bias); minimums, steps
and rebuilt values are the same bit for bit. While ``torch.compile``
traces and on fake tensors the eager operations run (the encoding, a custom operator, stays
opaque to the compiler and runs fused in a compiled step); under a memory meter the fused ones
do, as in training.
``MMDROPIT_FUSED=0`` or :func:`~mmdropit.kernels.switch.eager_only` keeps the eager path.

Example:
    >>> values = torch.linspace(-1.0, 2.0, 64)
    >>> packed, minimums, steps = quantize_low(values, bits=4)
    >>> packed.dtype, packed.numel(), minimums.numel()   # two codes a byte, two groups
    (torch.uint8, 32, 2)
    >>> rebuilt = dequantize_low(packed, minimums, steps, 4, values.numel(), torch.float32)
    >>> bool(((rebuilt - values).abs() < steps.repeat_interleave(32)).all())
    True
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.library import custom_op, register_fake

from ..common.random_source import capturable, device_seed, generator
from ..kernels import fused_codec_ops
from .int8 import CHUNK, GROUP

LOW_BITS = (4, 2)
"""Bit widths of this codec."""


def low_bit_bytes(numel: int, bits: int) -> int:
    """Bytes of ``numel`` values in ``bits`` bits with each group's minimum and step.

    Example:
        >>> low_bit_bytes(1000, 4)   # 32 groups: 512 bytes of codes, 32 * 8 of minimum and step
        768
    """
    groups = math.ceil(numel / GROUP)
    return groups * GROUP * bits // 8 + 8 * groups


def pack_codes(codes: torch.Tensor, bits: int) -> torch.Tensor:
    """Codes below ``2**bits`` (uint8, a multiple of ``8 / bits`` of them), ``8 / bits`` a
    byte, the first in the lowest bits."""
    lanes = codes.view(-1, 8 // bits)
    packed = lanes[:, 0].clone()
    for lane in range(1, 8 // bits):
        packed |= lanes[:, lane] << (bits * lane)
    return packed


def unpack_codes(packed: torch.Tensor, bits: int) -> torch.Tensor:
    """The uint8 codes :func:`pack_codes` packed."""
    shifts = torch.arange(0, 8, bits, dtype=torch.uint8, device=packed.device)
    return ((packed[:, None] >> shifts) & (2**bits - 1)).view(-1)


@custom_op('mmdropit::quantize_low', mutates_args=())
def quantize_low(values: torch.Tensor,
                 bits: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(packed, minimums, steps)``: the 1-D ``values`` in ``bits`` bits (4 or 2), rounded
    stochastically, with each group's minimum and step in float32."""
    fused = fused_codec_ops(values)
    if fused is not None:
        seed = device_seed(values.device, generator(values.device))
        return fused.quantize_low(values.contiguous(), bits, seed if values.is_cuda else int(seed))
    draw = capturable(generator(values.device))
    numel, levels = values.numel(), 2**bits - 1
    groups = math.ceil(numel / GROUP)
    packed = torch.empty(groups * GROUP * bits // 8, dtype=torch.uint8, device=values.device)
    minimums = torch.empty(groups, dtype=torch.float32, device=values.device)
    steps = torch.empty(groups, dtype=torch.float32, device=values.device)
    for start in range(0, numel, CHUNK):
        part = values[start:start + CHUNK].float()
        padded = F.pad(part, (0, -part.numel() % GROUP)).view(-1, GROUP)
        if part.numel() % GROUP:  # the padding repeats a value of its group: no wider range
            padded[-1, part.numel() % GROUP:] = part[-1]
        low = padded.amin(1)
        # times float32(1 / levels), not divided by it: the same product on every device
        step = (padded.amax(1) - low).clamp_min(torch.finfo(torch.float32).tiny).mul_(1 / levels)
        first = start // GROUP
        minimums[first:first + low.numel()], steps[first:first + low.numel()] = low, step
        noise = torch.rand(padded.shape, generator=draw, device=values.device)
        codes = padded.sub_(low[:, None]).div_(step[:, None]).add_(noise).floor_()
        codes = codes.clamp_(0, levels).to(torch.uint8)
        packed[first * GROUP * bits // 8:(first + low.numel()) * GROUP * bits // 8] = \
            pack_codes(codes.view(-1), bits)
    return packed, minimums, steps


@register_fake('mmdropit::quantize_low')
def _quantize_low_shapes(values, bits):
    groups = math.ceil(values.numel() / GROUP)
    return (values.new_empty((groups * GROUP * bits // 8,), dtype=torch.uint8),
            values.new_empty((groups,), dtype=torch.float32),
            values.new_empty((groups,), dtype=torch.float32))


def dequantize_low(packed: torch.Tensor, minimums: torch.Tensor, steps: torch.Tensor, bits: int,
                   numel: int, dtype: torch.dtype) -> torch.Tensor:
    """The ``numel`` values that :func:`quantize_low` encoded, in ``dtype``."""
    fused = fused_codec_ops(minimums)
    if fused is not None:
        return fused.dequantize_low(packed, minimums, steps, bits, numel, dtype)
    values = torch.empty(numel, dtype=dtype, device=packed.device)
    per_chunk = CHUNK * bits // 8
    for start in range(0, numel, CHUNK):
        first = start // GROUP
        codes = unpack_codes(packed[first * GROUP * bits // 8:][:per_chunk], bits)
        groups = codes.view(-1, GROUP).float()
        rebuilt = groups.mul_(steps[first:first + groups.shape[0], None])
        rebuilt.add_(minimums[first:first + groups.shape[0], None])
        count = min(CHUNK, numel - start)
        values[start:start + count] = rebuilt.view(-1)[:count]
    return values
