"""Compressed activations inside a plain checkpoint: codes stored when the region is recomputed.

A plain checkpoint (a plan's, :mod:`mmdropit.checkpoint`, or one the model makes with
``torch.utils.checkpoint``, non-reentrant: timm's ``set_grad_checkpointing()``) drops what its
region saves in the first forward pass and saves it again when backward recomputes the region; that
recomputation, held while the region's backward runs, sets the least peak a plan reaches. A
converted module's own hooks, the innermost, would hide its saved tensors from the checkpoint's
hooks; inside a region it therefore hands each saved tensor on to the hooks on top of the stack when
it runs, the checkpoint's (:func:`checkpoint_hooks`):

- in the first pass as uninitialised tensors of its codes' shapes and dtypes
  (:func:`~.bits.code_parts`): the checkpoint drops them, and finds the two passes alike where
  it compares what they saved by shape and dtype (``torch.utils.checkpoint`` does);
- in the recomputation as its codes, each part handed on as it is (joined into one tensor they
  would be copied while the dense tensor is alive): the checkpoint holds those bytes for
  backward instead of the dense tensor;
- in backward, the checkpoint hands the codes back, and the tensor is rebuilt from them.

Whether a tensor is stored as codes depends on it alone (the same test in both passes), so the
passes hand on the same number of tensors of the same shapes in the same order. A selective
checkpoint replays its first pass's ops in order; the encoding would add ops to its
recomputation, so converted modules step aside there (the checkpoint keeps or recomputes their
dense tensors).

Example:
    >>> from torch import nn
    >>> from mmdropit.checkpoint import checkpoint_module
    >>> from mmdropit.codecs import compress_activations
    >>> net = nn.Sequential(nn.Linear(64, 256), nn.LayerNorm(256), nn.GELU(), nn.Linear(256, 8))
    >>> _ = compress_activations(net, bits=8)
    >>> checkpoint_module(net)
    >>> net(torch.randn(32, 64)).sum().backward()   # LayerNorm and GELU saved as codes
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from ..common.saved_tensors import top_hooks
from .bits import code_parts, dequantize_values, quantize_values


@dataclass(frozen=True)
class _Handed:
    """A saved tensor handed to the checkpoint's hooks.

    Attributes:
        handles: What the checkpoint's pack hook returned for each tensor handed on: the tensor
            itself, or each part of its codes.
        bits: The bit width its recomputation stores it in (``None``: stored as it is).
        shape: Its shape.
        dtype: Its dtype.
    """

    handles: tuple[object, ...]
    bits: int | None
    shape: torch.Size
    dtype: torch.dtype


def checkpoint_hooks(bits: int, stored_as_codes: Callable[[torch.Tensor], bool],
                     recomputation: bool,
                     stored: Callable[[torch.Tensor, int], None] | None = None
                     ) -> torch.autograd.graph.saved_tensors_hooks | None:
    """Hooks that hand a converted module's saved tensors to the checkpoint's hooks (the pair on
    top of the stack now); ``None`` when there is no such pair, or this torch does not say (the
    module then steps aside, as inside a selective checkpoint).

    Args:
        bits: The converted module's bit width.
        stored_as_codes: Whether a saved tensor is stored as codes (a test of the tensor alone).
        recomputation: Whether this is the checkpoint's recomputation (the tensors are encoded)
            or its first pass (uninitialised bytes of their codes' size are handed on, and
            dropped).
        stored: Called as ``stored(dense, code_bytes)`` for each tensor the recomputation
            stores as codes.
    """
    outer = top_hooks()
    if outer is None:
        return None
    outer_pack, outer_unpack = outer

    def pack(tensor: torch.Tensor) -> _Handed:
        if not stored_as_codes(tensor):
            return _Handed((outer_pack(tensor),), None, tensor.shape, tensor.dtype)
        if recomputation:
            codes = quantize_values(tensor.detach().reshape(-1), bits)
            if stored is not None:
                stored(tensor, sum(code.nbytes for code in codes))
        else:
            codes = tuple(tensor.new_empty(count, dtype=dtype)
                          for dtype, count in code_parts(tensor.numel(), bits))
        return _Handed(tuple(outer_pack(code) for code in codes), bits, tensor.shape,
                       tensor.dtype)

    def unpack(handed: _Handed) -> torch.Tensor:
        saved = tuple(outer_unpack(handle) for handle in handed.handles)
        if handed.bits is None:
            return saved[0]
        values = dequantize_values(saved, handed.bits, handed.shape.numel(), handed.dtype)
        return values.view(handed.shape)

    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)
