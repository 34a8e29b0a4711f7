"""Per-group int8: one float32 scale per group of values, as Mesa stores activations.

Each value becomes an int8 ``round(v / s)`` with ``s = max|v| * float32(1 / 127)`` over its
group of :data:`GROUP` consecutive values (in memory order), plus one float32 scale per group:
``numel * (1 + 4 / GROUP)`` bytes instead of ``numel * element_size``. Rounding to the nearest
step errs by at most half a step, ``max|v| / 254`` of its group. Groups of 32, not Mesa's larger
ones: a transformer's residual stream has outlier channels, and with groups of 128 the
LayerNorm weight gradients of a small ViT erred by up to 6% (1% with 32), for 0.09 more bytes
per value. The scale is a product by the float32 reciprocal of 127, not a quotient: PyTorch
divides a CUDA tensor by a number that way and a CPU tensor exactly, so a product written out
keeps every path's scales (eager on either device, the CPU and the GPU kernels) the same bit for
bit; ``v / s`` is a true division everywhere.

On the CPU, when the fused kernels are built (:mod:`mmdropit.kernels.cpu`), both ways are one
pass of ``torch.ops.mmdropit_cpu`` (``quantize_int8``, ``dequantize_int8``), and on a GPU with
Triton one launch of :mod:`mmdropit.kernels.cuda.codec_kernels`, with the same results bit for
bit; traced (``torch.compile``, fake tensors) the eager operations run
(:func:`~mmdropit.common.custom_operators.traced`); under a memory meter the fused ones do, so
that it sees what training holds.

Example:
    >>> values = torch.tensor([0.5, -1.0, 0.25, 2.0])
    >>> codes, scales = quantize(values)
    >>> codes.tolist(), round(scales.item() * 127, 4)   # one group: its scale is max|v| / 127
    ([32, -64, 16, 127], 2.0)
    >>> (dequantize(codes, scales, torch.float32) - values).abs().max() <= 2.0 / 254
    tensor(True)
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from ..common.custom_operators import traced
from ..kernels import fused_codec_ops

GROUP = 32
"""Values that share one scale."""


def quantized_bytes(numel: int) -> int:
    """Bytes of ``numel`` values in 8 bits with their scales.

    Example:
        >>> quantized_bytes(1000)   # 1000 codes + 32 float32 scales
        1128
    """
    return numel + 4 * math.ceil(numel / GROUP)


CHUNK = 1 << 18
"""Values converted at a time (a multiple of :data:`GROUP`): the temporaries of a conversion
stay within a chunk's size whatever the tensor's. Traced for a compiled graph, a tensor is
converted in one piece (the compiler fuses the operations, and a loop would be unrolled)."""


def _chunk(values: torch.Tensor) -> int:
    """Values converted at a time: :data:`CHUNK`, or all of them where ``values`` is traced."""
    return max(values.numel(), 1) if traced(values) else CHUNK


def quantize(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(codes, scales)``: int8 codes of the 1-D ``values`` and a float32 scale per group."""
    fused = fused_codec_ops(values)
    if fused is not None:
        return fused.quantize_int8(values.contiguous())
    numel = values.numel()
    codes = torch.empty(numel, dtype=torch.int8, device=values.device)
    scales = torch.empty(math.ceil(numel / GROUP), dtype=torch.float32, device=values.device)
    chunk = _chunk(values)
    for start in range(0, numel, chunk):
        part = values[start:start + chunk].float()
        groups = F.pad(part, (0, -part.numel() % GROUP)).view(-1, GROUP)
        # times float32(1 / 127), not divided by 127: the same product on every device
        part_scales = groups.abs().amax(1).clamp_min(torch.finfo(torch.float32).tiny).mul_(1 / 127)
        scales[start // GROUP:start // GROUP + part_scales.numel()] = part_scales
        part_codes = torch.div(groups, part_scales[:, None]).round_().to(torch.int8)
        codes[start:start + part.numel()] = part_codes.view(-1)[:part.numel()]
    return codes, scales


def dequantize(codes: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The 1-D values that :func:`quantize` encoded, in ``dtype``."""
    fused = fused_codec_ops(scales)
    if fused is not None:
        return fused.dequantize_int8(codes, scales, dtype)
    numel = codes.numel()
    values = torch.empty(numel, dtype=dtype, device=codes.device)
    chunk = _chunk(codes)
    for start in range(0, numel, chunk):
        part = codes[start:start + chunk]
        groups = F.pad(part, (0, -part.numel() % GROUP)).view(-1, GROUP)
        part_scales = scales[start // GROUP:start // GROUP + groups.shape[0]]
        rebuilt = groups.float().mul_(part_scales[:, None])
        values[start:start + part.numel()] = rebuilt.view(-1)[:part.numel()]
    return values
