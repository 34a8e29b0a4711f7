"""Saved views rebuilt with the strides they were saved with.

A module often saves a view rather than a tensor of its own: timm's attention saves the query,
key and value that ``unbind`` takes out of one ``qkv`` tensor, each with the strides of that
tensor. Eager backward formulas take any strides, but a backward graph that ``torch.compile``
built asserts the strides of what it saved, so a saved view stored as codes must come back with
its own: it is rebuilt inside a buffer laid out like the storage it was a view of.

The views saved from one storage share one buffer, which spans the part of the storage they
cover (the query, key and value of one attention: one buffer of ``qkv``'s size, the bytes of
three separate tensors). The buffer lives while a view rebuilt in it is held. A single view of a
larger storage (a slice) takes the span it reaches while it is held in backward: never more than
the storage the dense view kept alive from the forward pass to the backward pass.

Example:
    >>> qkv = torch.randn(4, 3, 8)
    >>> q, k, v = qkv.unbind(1)
    >>> layouts = [ViewLayout.of(t) for t in (q, k, v)]
    >>> q2, k2, v2 = [layout.rebuild(t.reshape(-1)) for layout, t in zip(layouts, (q, k, v))]
    >>> q2.stride() == q.stride() and q2.untyped_storage() is k2.untyped_storage()
    True
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import torch


def _extent(tensor: torch.Tensor) -> int:
    """How many elements of its storage a tensor reaches past its offset."""
    return 1 + sum((size - 1) * stride for size, stride in zip(tensor.shape, tensor.stride()))


def elements_apart(tensor: torch.Tensor) -> bool:
    """Whether no two elements of a tensor share a storage element (tested dimension by
    dimension, smallest stride first: each stride passes what the dimensions below it reach;
    dimensions of size 1 take no room)."""
    reach = 0
    for stride, size in sorted(zip(tensor.stride(), tensor.shape)):
        if size == 1:
            continue
        if stride <= reach:
            return False
        reach += (size - 1) * stride
    return True


class _StorageSpan:
    """The part of one storage, in elements of one dtype, that the views saved from it cover,
    and the buffer they are rebuilt in while one of them is held."""

    def __init__(self, view: torch.Tensor) -> None:
        self.dtype = view.dtype
        self.device = view.device
        self.start = view.storage_offset()
        self.end = self.start + _extent(view)
        self._buffer: weakref.ref[torch.Tensor] | None = None
        self._buffer_start = 0

    def cover(self, view: torch.Tensor) -> None:
        """Take in one more view saved from the storage."""
        self.start = min(self.start, view.storage_offset())
        self.end = max(self.end, view.storage_offset() + _extent(view))

    def buffer(self) -> tuple[torch.Tensor, int]:
        """The buffer the views are rebuilt in and the storage element its first one stands
        for: the one a held view lives in, or a new one where none is held (or where a view
        saved since lies outside it)."""
        held = self._buffer() if self._buffer is not None else None
        if held is not None and self._buffer_start <= self.start \
                and self.end <= self._buffer_start + held.numel():
            return held, self._buffer_start
        fresh = torch.empty(self.end - self.start, dtype=self.dtype, device=self.device)
        self._buffer, self._buffer_start = weakref.ref(fresh), self.start
        return fresh, self.start


_SPANS: weakref.WeakKeyDictionary[torch.UntypedStorage, dict[torch.dtype, _StorageSpan]] = \
    weakref.WeakKeyDictionary()
"""The spans of the storages that saved views come from, forgotten with each storage."""


@dataclass(frozen=True)
class ViewLayout:
    """Where a saved view lies in its storage: enough to rebuild it with the same strides.

    Attributes:
        span: The covered part of its storage, shared with the other views saved from it.
        shape: The view's shape.
        stride: The view's strides.
        offset: The view's first element in its storage.
    """

    span: _StorageSpan
    shape: torch.Size
    stride: tuple[int, ...]
    offset: int

    @classmethod
    def of(cls, tensor: torch.Tensor) -> ViewLayout | None:
        """The layout of a saved tensor, or ``None`` where it needs none: it is contiguous, or
        its elements overlap (an expanded tensor), which a buffer could not hold apart."""
        if tensor.is_contiguous() or not elements_apart(tensor):
            return None
        spans = _SPANS.setdefault(tensor.untyped_storage(), {})
        span = spans.get(tensor.dtype)
        if span is None:
            span = spans[tensor.dtype] = _StorageSpan(tensor)
        else:
            span.cover(tensor)
        return cls(span, tensor.shape, tensor.stride(), tensor.storage_offset())

    def rebuild(self, values: torch.Tensor) -> torch.Tensor:
        """The view, its elements ``values`` (in its row-major order), with its strides."""
        buffer, start = self.span.buffer()
        view = buffer.as_strided(self.shape, self.stride, self.offset - start)
        return view.copy_(values.view(self.shape))
