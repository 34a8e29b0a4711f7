"""Fused kernels for DropIT's selection, compaction and rebuilding.

- :mod:`.cpu`: a C++ / OpenMP extension (``dropit_kernels.cpp``), built once by ``make env``
  (``python -m mmdropit.kernels.cpu.build``) with torch's ``cpp_extension`` and loaded, when it
  matches this torch and these sources, the first time a DropIT layer runs on the CPU.
- :mod:`.cuda`: Triton kernels (``dropit_kernels.py``), compiled by Triton the first time a
  DropIT layer runs on a GPU.
- :mod:`.switch`: ``MMDROPIT_FUSED=0`` / :func:`~.switch.eager_only` keep the eager path.

Both give DropIT's custom operators (:mod:`mmdropit.dropit.ops`) the same four operations,
which :func:`fused_ops` hands out for a tensor. A layer calls them when they can run on its
input and falls back to the eager PyTorch path otherwise (one warning line says why). Every
path gives bit-identical saved tensors. A DropIT Linear's and a DropIT convolution's forward and
backward run as one C++ autograd node each where they can (``cpu/dropit_linear.cpp``,
``cpu/dropit_conv.cpp``; :func:`fused_linear_node`, :func:`fused_conv_node`; on a GPU with the
Triton kernels registered as their selection operators' CUDA implementations): no Python
between their operators.

The integer codecs (:mod:`mmdropit.codecs.int8`, :mod:`mmdropit.codecs.low_bit`) take their
one-pass encoding and decoding from :func:`fused_codec_ops`: the C++ operators on the CPU, the
Triton kernels of :mod:`.cuda.codec_kernels` on a GPU (the same results bit for bit; the 4- and
2-bit encoders take their seed as an ``int`` on the CPU and as a one-element int64 tensor on a
GPU, so that nothing is read back from it).

Example:
    >>> ops = fused_ops(torch.randn(4))
    >>> ops is None or callable(ops.keep_topk)
    True
"""
from __future__ import annotations

from typing import Any

import torch

from ..common.custom_operators import through_dispatcher, traced
from . import cpu, cuda
from .switch import nodes_enabled

__all__ = ['fused_codec_ops', 'fused_conv_node', 'fused_lean_node', 'fused_linear_node',
           'fused_ops']


def fused_ops(x: torch.Tensor) -> Any | None:
    """The fused operations for ``x``'s device (``keep_topk``, ``keep_random``,
    ``above_counts``, ``write_above``, ``scatter_bitmask``), or ``None`` when none can run on
    it."""
    if cpu.usable(x):
        return torch.ops.mmdropit_cpu
    if cuda.usable(x):
        return cuda.load()
    return None


def fused_linear_node(x: torch.Tensor) -> Any | None:
    """DropIT's Linear as one C++ autograd node for ``x``'s device
    (``dropit_linear(x, weight, bias, kept, first=None, values=None, generator=None)``:
    ``mink`` kept in the bitmask encoding, ``random`` drawn from ``generator`` where one is
    given, or the encoded selection ``first`` + ``values`` it is given; the same
    tensors and gradients as :class:`~mmdropit.dropit.functional.DropITLinearFunction`), or
    ``None`` where it cannot run (:func:`_node_runs_on`)."""
    return torch.ops.mmdropit_cpu.dropit_linear.default if _node_runs_on(x) else None


def fused_conv_node(x: torch.Tensor) -> Any | None:
    """DropIT's N-d convolution as one C++ autograd node for ``x``'s device
    (``dropit_conv(x, weight, bias, stride, padding, dilation, groups, kept, first=None,
    values=None, generator=None)``: as :func:`fused_linear_node` selects; the same tensors and
    gradients as
    :class:`~mmdropit.dropit.functional.DropITConvFunction` without its uneven padding), or
    ``None`` where it cannot run (:func:`_node_runs_on`)."""
    return torch.ops.mmdropit_cpu.dropit_conv.default if _node_runs_on(x) else None


def fused_lean_node(x: torch.Tensor, bounded: bool, inplace: bool) -> Any | None:
    """The lean ReLU (``bounded`` false: ``lean_relu(x)``) or Hardtanh
    (``lean_hardtanh(x, min_val, max_val)``), in place where ``inplace``, as one C++ autograd
    node for ``x``'s device (the same outputs, gradients and saved bits as
    :mod:`~mmdropit.dropit.lean_activations`' Python Function), or ``None`` where it cannot run
    (:func:`_node_runs_on`)."""
    if not _node_runs_on(x):
        return None
    ops = torch.ops.mmdropit_cpu
    if bounded:
        return ops.lean_hardtanh_.default if inplace else ops.lean_hardtanh.default
    return ops.lean_relu_.default if inplace else ops.lean_relu.default


def _node_runs_on(x: torch.Tensor) -> bool:
    """Whether a C++ node can take this call on ``x`` in place of its Python Function: ``x``
    contiguous (a node reads it flat), nothing compiling, transforming (functorch) or
    observing (a dispatch mode) the call, which a node has no fake or batched form for, not
    inside :func:`~.switch.without_nodes`, and the CPU kernels built (they hold the nodes), on
    a GPU with Triton (:func:`~.cuda.node_ready`)."""
    if torch.compiler.is_compiling() or torch._C._are_functorch_transforms_active() or \
            through_dispatcher() or not (nodes_enabled() and x.is_contiguous()):
        return False
    return cpu.usable(x) or (cuda.usable(x) and cuda.node_ready())


def fused_codec_ops(x: torch.Tensor) -> Any | None:
    """The fused codec operations for ``x``'s device (``quantize_int8``, ``dequantize_int8``,
    ``quantize_low``, ``dequantize_low``), or ``None`` when none can run on it (the CPU kernels
    not built, Triton missing, a dtype they do not take) and while traced (they have no fake
    implementation, and a compiler fuses the eager operations itself). Under a dispatch mode on
    real tensors (a memory meter) they run: the meter sees what training holds, not the eager
    operations' temporaries."""
    if traced(x):
        return None
    if cpu.usable(x):
        return torch.ops.mmdropit_cpu
    if cuda.codecs_usable(x):
        return cuda.load_codecs()
    return None
