"""Memory-lean activations: ReLU, Hardtanh/ReLU6 and LeakyReLU that keep a 1-bit mask.

PyTorch's ReLU saves its whole output for backward. In a CNN that output is the input of the next
convolution, so the convolution's DropIT saving is void: the dense tensor stays alive anyway.
These activations save only where the gradient passes (1 bit per element, packed 8 to a byte), so
once the next layer compresses its input nothing keeps the dense tensor. They compute the same
outputs and gradients as PyTorch's (in place or not). On the CPU the mask is packed, and the
gradient masked, in one fused pass each where the kernels of :mod:`mmdropit.kernels.cpu` are
built (contiguous tensors; LeakyReLU's gradient stays eager), and on a GPU with Triton in one
launch each of :mod:`mmdropit.kernels.cuda.codec_kernels` (the same bits and gradients), inside
the custom operators ``mmdropit::pack_passes`` and ``mmdropit::where_passes`` so that
``torch.compile`` traces them. A ReLU or Hardtanh on a contiguous input runs as one C++ autograd
node where the CPU kernels are built (:func:`~mmdropit.kernels.fused_lean_node`: the same
operators, no Python between them; on a GPU with the Triton kernels), the Python Function
elsewhere.

=============  ============================  ===================================
activation     gradient passes where         gradient there
=============  ============================  ===================================
ReLU           ``x > 0``                     ``grad``
Hardtanh/ReLU6 ``min_val < x < max_val``     ``grad`` (zero elsewhere)
LeakyReLU      ``x > 0``                     ``grad``; ``negative_slope * grad``
=============  ============================  ===================================

Example:
    >>> x = torch.randn(4, 8, requires_grad=True)
    >>> lean_relu(x.clone()).sum().backward()
    >>> torch.equal(x.grad, (x > 0).float())
    True
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.library import custom_op, register_fake

from ..common.custom_operators import operator_or_body
from ..common.eager_backward import eager_backward
from ..kernels import cpu as fused_cpu
from ..kernels import cuda as fused_cuda
from ..kernels import fused_lean_node
from .compact import pack_bits, unpack_bits


def _pack_passes(x: torch.Tensor, low: float, high: float, bounded: bool) -> torch.Tensor:
    """The packed mask of ``low < x`` (and ``x < high`` when ``bounded``), in ``x``'s logical
    order; one fused pass on the CPU where the kernels are built."""
    if x.is_contiguous() and fused_cpu.usable(x):
        return torch.ops.mmdropit_cpu.pack_between(x.view(-1), low, high, bounded)
    if x.is_contiguous() and fused_cuda.codecs_usable(x):
        return fused_cuda.load_codecs().pack_between(x.view(-1), low, high, bounded)
    return pack_bits((x > low) & (x < high) if bounded else x > low)


custom_op('mmdropit::pack_passes', _pack_passes, mutates_args=())


@register_fake('mmdropit::pack_passes')
def _pack_passes_shape(x, low, high, bounded):
    return x.new_empty(((x.numel() + 7) // 8,), dtype=torch.uint8)


def _where_passes(grad: torch.Tensor, packed: torch.Tensor) -> torch.Tensor:
    """``grad`` where the packed mask is set, zero elsewhere (contiguous)."""
    if grad.is_contiguous() and fused_cpu.usable(grad):
        return torch.ops.mmdropit_cpu.where_bits(grad.view(-1), packed).view(grad.shape)
    if grad.is_contiguous() and fused_cuda.codecs_usable(grad):
        return fused_cuda.load_codecs().where_bits(grad.view(-1), packed).view(grad.shape)
    passes = unpack_bits(packed, grad.numel()).view(grad.shape)
    return torch.where(passes, grad, 0.0).contiguous()


custom_op('mmdropit::where_passes', _where_passes, mutates_args=())


@register_fake('mmdropit::where_passes')
def _where_passes_shape(grad, packed):
    return grad.new_empty(grad.shape)


@eager_backward
class _LeanActivationFunction(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x: torch.Tensor, kind: str, low: float, high: float, slope: float,
                inplace: bool) -> torch.Tensor:
        bounded = kind == 'hardtanh'
        pack = operator_or_body(torch.ops.mmdropit.pack_passes, _pack_passes)
        packed = pack(x, low if bounded else 0.0, high, bounded)
        if kind == 'hardtanh':
            out = F.hardtanh(x, low, high, inplace=inplace)
        elif kind == 'leaky_relu':
            out = F.leaky_relu(x, slope, inplace=inplace)
        else:
            out = F.relu(x, inplace=inplace)
        if inplace:
            ctx.mark_dirty(x)
        ctx.kind, ctx.slope, ctx.numel = kind, slope, x.numel()
        ctx.save_for_backward(packed)
        return out

    @staticmethod
    def backward(ctx, grad_out: torch.Tensor):
        (packed,) = ctx.saved_tensors
        if ctx.kind == 'leaky_relu':
            passes = unpack_bits(packed, ctx.numel).view(grad_out.shape)
            grad = torch.where(passes, grad_out, grad_out * ctx.slope)
        else:
            where = operator_or_body(torch.ops.mmdropit.where_passes, _where_passes)
            grad = where(grad_out, packed)
        return grad, None, None, None, None, None


def _needs_grad(x: torch.Tensor) -> bool:
    return torch.is_grad_enabled() and x.requires_grad


def lean_relu(x: torch.Tensor, inplace: bool = False) -> torch.Tensor:
    """``F.relu`` that keeps a 1-bit mask for backward."""
    if not _needs_grad(x):
        return F.relu(x, inplace=inplace)
    node = fused_lean_node(x, False, inplace)
    if node is not None:
        return node(x)
    return _LeanActivationFunction.apply(x, 'relu', 0.0, 0.0, 0.0, inplace)


def lean_hardtanh(x: torch.Tensor, min_val: float = -1.0, max_val: float = 1.0,
                  inplace: bool = False) -> torch.Tensor:
    """``F.hardtanh`` (``F.relu6`` with 0 and 6) that keeps a 1-bit mask for backward."""
    if not _needs_grad(x):
        return F.hardtanh(x, min_val, max_val, inplace=inplace)
    node = fused_lean_node(x, True, inplace)
    if node is not None:
        return node(x, min_val, max_val)
    return _LeanActivationFunction.apply(x, 'hardtanh', min_val, max_val, 0.0,
                                         inplace)


def lean_leaky_relu(x: torch.Tensor, negative_slope: float = 0.01,
                    inplace: bool = False) -> torch.Tensor:
    """``F.leaky_relu`` that keeps a 1-bit mask for backward."""
    if not _needs_grad(x):
        return F.leaky_relu(x, negative_slope, inplace=inplace)
    return _LeanActivationFunction.apply(x, 'leaky_relu', 0.0, 0.0,
                                         negative_slope, inplace)
