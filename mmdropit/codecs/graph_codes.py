"""What a compiled graph saves for backward, stored as codes inside the graph.

``torch.compile`` (AOTAutograd) inlines saved-tensor hooks that are ``torch.fx.GraphModule`` s:
the pack hook is traced into the end of each compiled forward graph, on every intermediate the
graph saves (the tensors it alone holds; not its inputs, parameters or outputs), and the unpack
hook into the start of the backward graph. The int8 codec of :mod:`.int8` (per-group int8 with a
float32 scale per 32 values) thus runs as the compiler's own fused kernels beside the operations
that make and use the saved tensors, with no Python call, launch of ours or graph break per
tensor (the per-module hooks of :mod:`.activations` break the graph at each converted module).
The 4- and 2-bit codecs are not offered here: their encoder is a custom operator the compiler
cannot fuse (docs/dropit.md). Every floating intermediate of at least
:data:`~.activations.MIN_NUMEL` elements is stored as codes: Linear and convolution inputs too,
as in Mesa, not only what norms, activations and attention save.

The hooks must be on top of the saved-tensor hooks while a graph compiles: dynamo guards on
the hooks on top, so the same code compiled under other hooks, or none, is another graph.
Outside compiled graphs (eager code between them, or a graph compiled under other hooks above
these) the same hooks run as ordinary ones, in Python for each tensor, and store every such
floating tensor that is neither a parameter nor a strided view as codes.

The gradient is that of the rounded saved tensors (each value within ``max|v| / 254`` of its
group of 32).

Example:
    >>> model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.GELU(),
    ...                             torch.nn.Linear(128, 8))
    >>> compiled = torch.compile(model)
    >>> with int8_graph_hooks():   # around the forward pass: its first call compiles with them
    ...     loss = compiled(torch.randn(64, 64)).sum()
    >>> loss.backward()
"""
from __future__ import annotations

import torch
import torch.fx
from torch._subclasses.fake_tensor import is_fake

from .activations import worth_codes
from .int8 import dequantize, quantize

_Packed = tuple  # (tensor,) as saved, or (codes, scales, shape, dtype)


@torch.compiler.disable  # run as it is where eager code calls the hooks, never traced by dynamo
def _int8_pack(tensor: torch.Tensor) -> _Packed:
    """``tensor`` as int8 codes, or as it is: not floating, small, a parameter, or, outside a
    compiled graph, a view whose strides a compiled backward could assert."""
    if not (worth_codes(tensor) and (is_fake(tensor) or tensor.is_contiguous())):
        return (tensor,)
    return (*quantize(tensor.detach().reshape(-1)), tensor.shape, tensor.dtype)


@torch.compiler.disable
def _int8_unpack(packed: _Packed) -> torch.Tensor:
    """The tensor :func:`_int8_pack` stored."""
    if len(packed) == 1:
        return packed[0]
    codes, scales, shape, dtype = packed
    return dequantize(codes, scales, dtype).view(shape)


torch.fx.wrap('_int8_pack')  # leaves of the traced hooks, traced again per saved tensor
torch.fx.wrap('_int8_unpack')


def _pack(tensor: torch.Tensor) -> _Packed:
    return _int8_pack(tensor)


def _unpack(packed: _Packed) -> torch.Tensor:
    return _int8_unpack(packed)


_TRACED: list[tuple[torch.fx.GraphModule, torch.fx.GraphModule]] = []
"""The traced hooks, made once: dynamo guards on the hooks' identity, and hooks traced anew
would compile every graph again."""


def int8_graph_hooks() -> torch.autograd.graph.saved_tensors_hooks:
    """The saved-tensor hooks that store what compiled graphs save in int8 (see the module
    doc), as a context manager to hold while the compiled forward pass runs (and compiles).

    Config (through :class:`~mmdropit.engine.hooks.GraphInt8Hook`)::

        custom_hooks = [dict(type='GraphInt8Hook')]
        compile = True
    """
    if not _TRACED:
        _TRACED.append((torch.fx.symbolic_trace(_pack), torch.fx.symbolic_trace(_unpack)))
    return torch.autograd.graph.saved_tensors_hooks(*_TRACED[0])
