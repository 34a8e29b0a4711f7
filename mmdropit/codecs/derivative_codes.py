"""GELU and SiLU that save a 4-bit code of their input instead of the input: the backward pass
needs only the derivative, and a piecewise-constant derivative needs only to know which piece
each element fell in (the few-bit backward of Novikov et al., 2023).

The input axis is cut into :data:`LEVELS` intervals, chosen once per activation by dynamic
programming to minimise the squared error of the piecewise-constant derivative, weighted by a
standard normal density (plus a small floor, so the tails count too); each interval's value is
the weighted mean of the derivative over it. An element is stored as its interval's index,
packed two to a byte: 0.125 of an fp32 input, and no scales. The input gradient is
``grad_output * table[code]``: not unbiased, but the error is bounded by the table's fit
(:func:`derivative_table` reports it). Coding and scaling are one pass each where the fused
kernels run (the CPU extension's and the Triton ``bucket_codes`` / ``scale_by_codes``, the
same bytes and gradients as the eager ``bucketize``, packing and lookup).

Example:
    >>> x = torch.randn(64, 128, requires_grad=True)
    >>> y = lean_activation(x, 'gelu')
    >>> torch.equal(y, torch.nn.functional.gelu(x))     # the forward pass is exact
    True
    >>> y.sum().backward()
    >>> exact = torch.autograd.grad(torch.nn.functional.gelu(x).sum(), x)[0]
    >>> bool((x.grad - exact).abs().max() < 0.1)
    True
"""
from __future__ import annotations

import functools
import math
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from ..common.eager_backward import eager_backward
from ..common.saved_tensors import report_kept
from ..kernels import fused_codec_ops
from .low_bit import pack_codes, unpack_codes

CODE_BITS = 4
"""Bits of an element's code."""
LEVELS = 2**CODE_BITS
"""Intervals of the input axis."""
_GRID = torch.linspace(-8.0, 8.0, 1601, dtype=torch.float64)
_FUNCTIONS = {'gelu': F.gelu, 'gelu_tanh': functools.partial(F.gelu, approximate='tanh'),
              'silu': F.silu}


def _gelu_slope(x: torch.Tensor) -> torch.Tensor:
    density = torch.exp(-x**2 / 2) / math.sqrt(2 * math.pi)
    return 0.5 * (1 + torch.erf(x / math.sqrt(2))) + x * density


def _gelu_tanh_slope(x: torch.Tensor) -> torch.Tensor:
    inner = math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)
    tanh = torch.tanh(inner)
    return 0.5 * (1 + tanh) + 0.5 * x * (1 - tanh**2) * math.sqrt(2 / math.pi) * (
        1 + 3 * 0.044715 * x**2)


def _silu_slope(x: torch.Tensor) -> torch.Tensor:
    sigmoid = torch.sigmoid(x)
    return sigmoid * (1 + x * (1 - sigmoid))


_SLOPES = {'gelu': _gelu_slope, 'gelu_tanh': _gelu_tanh_slope, 'silu': _silu_slope}
"""The exact derivatives (closed forms: no autograd, so no saved tensors when a table is
first computed inside a training step)."""


@dataclass(frozen=True)
class DerivativeTable:
    """A piecewise-constant derivative.

    Attributes:
        boundaries: The ``LEVELS - 1`` inner interval boundaries, ascending.
        values: The derivative on each of the ``LEVELS`` intervals.
        rms_error: Root-mean-square error of the approximation under the weighting.
    """

    boundaries: torch.Tensor
    values: torch.Tensor
    rms_error: float


@functools.cache
def derivative_table(kind: str) -> DerivativeTable:
    """The optimal :data:`LEVELS`-piece derivative of ``kind`` (``'gelu'``, ``'gelu_tanh'``,
    ``'silu'``), computed once.

    Example:
        >>> table = derivative_table('gelu')
        >>> table.boundaries.numel(), round(table.rms_error, 3)
        (15, 0.025)
    """
    slope = _SLOPES[kind](_GRID)
    weight = torch.exp(-_GRID**2 / 2) / math.sqrt(2 * math.pi) + 1e-3
    # prefix sums: the weighted squared error of any run of grid points in O(1)
    zero = torch.zeros(1, dtype=torch.float64)
    w = torch.cat([zero, weight.cumsum(0)])
    wf = torch.cat([zero, (weight * slope).cumsum(0)])
    wff = torch.cat([zero, (weight * slope**2).cumsum(0)])
    count = _GRID.numel()
    start, end = torch.meshgrid(torch.arange(count + 1), torch.arange(count + 1), indexing='ij')
    mass = (w[end] - w[start]).clamp_min(1e-30)
    cost = wff[end] - wff[start] - (wf[end] - wf[start])**2 / mass
    cost = torch.where(end > start, cost, torch.full_like(cost, math.inf))
    best = cost[0].clone()  # best[j]: the first j points in one piece
    cuts = []
    for _ in range(LEVELS - 1):
        total = best[:, None] + cost  # [i, j]: pieces so far up to i, then one from i to j
        best, choice = total.min(0)
        cuts.append(choice)
    edges = [count]
    for choice in reversed(cuts):
        edges.append(int(choice[edges[-1]]))
    edges = [0, *edges[::-1]]  # LEVELS + 1 indices from 0 to count
    values = torch.stack([(wf[b] - wf[a]) / (w[b] - w[a]) for a, b in zip(edges, edges[1:])])
    boundaries = torch.stack([(_GRID[i - 1] + _GRID[i]) / 2 for i in edges[1:-1]])
    rms = math.sqrt(float(best[count]) / float(w[count]))
    return DerivativeTable(boundaries.float(), values.float(), rms)


@functools.cache
def _table_on(kind: str, device: torch.device, dtype: torch.dtype) -> DerivativeTable:
    """:func:`derivative_table` with its boundaries and values on ``device`` in ``dtype``
    (copied once: a copy from host memory at every call would wait for the GPU)."""
    table = derivative_table(kind)
    return replace(table, boundaries=table.boundaries.to(device, dtype),
                   values=table.values.to(device, dtype))


def encode(x: torch.Tensor, kind: str) -> torch.Tensor:
    """The 4-bit codes of ``x``'s elements, the pieces of ``kind``'s table they fall in
    (``torch.bucketize``), two a byte, the first in the low bits; in one pass where the fused
    kernels run (:func:`~mmdropit.kernels.fused_codec_ops`)."""
    flat = x.detach().reshape(-1)
    boundaries = _table_on(kind, x.device, x.dtype).boundaries
    fused = fused_codec_ops(flat)
    if fused is not None:
        return fused.bucket_codes(flat, boundaries)
    codes = torch.bucketize(flat, boundaries).to(torch.uint8)
    return pack_codes(F.pad(codes, (0, codes.numel() % 2)), CODE_BITS)


def scale_gradient(grad: torch.Tensor, packed: torch.Tensor, kind: str) -> torch.Tensor:
    """``grad`` times the derivative of ``kind`` on the pieces :func:`encode` coded, in
    ``grad``'s dtype; in one pass where the fused kernels run on the contiguous ``grad``."""
    values = _table_on(kind, grad.device, grad.dtype).values
    fused = fused_codec_ops(grad) if grad.is_contiguous() else None
    if fused is not None:
        return fused.scale_by_codes(grad.view(-1), packed, values).view(grad.shape)
    codes = unpack_codes(packed, CODE_BITS)[:grad.numel()].long()
    return grad * values[codes].view(grad.shape)


@eager_backward
class _LeanActivation(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, kind: str) -> torch.Tensor:
        packed = encode(x, kind)
        report_kept(packed)
        ctx.save_for_backward(packed)
        ctx.kind = kind
        return _FUNCTIONS[kind](x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        (packed,) = ctx.saved_tensors
        return scale_gradient(grad, packed, ctx.kind), None


def lean_activation(x: torch.Tensor, kind: str) -> torch.Tensor:
    """``kind`` (``'gelu'``, ``'gelu_tanh'``, ``'silu'``) of ``x``, saving 4-bit derivative codes
    for backward when autograd needs them."""
    if not (torch.is_grad_enabled() and x.requires_grad):
        return _FUNCTIONS[kind](x)
    return _LeanActivation.apply(x, kind)
