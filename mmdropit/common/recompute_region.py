"""Whether the code running now is inside a region a checkpoint recomputes, and in which pass.

A checkpoint drops every tensor saved inside its region and recomputes it in the backward pass;
a module that stores its saved tensors compactly (:mod:`mmdropit.codecs.activations`) would, as
the innermost saved-tensor hook, keep its codes there instead of letting them be dropped, and
its hooks would hide the recomputed tensors from the checkpoint. The checkpoint wrapper
(:mod:`mmdropit.checkpoint.apply`) therefore marks its region, in the first forward pass and in
the recomputation, and such modules step aside inside it. The mark is per thread: autograd may
recompute on another thread than the forward pass's.

Within a region, the first forward pass's saved tensors are dropped at once and only the
recomputation's are used (:func:`saved_tensors_dropped`): a DropIT layer saves placeholders of
the right shapes there instead of selecting twice. A plain checkpoint's recomputation is marked
too (:func:`in_recomputation`): a compressed module stores its codes there, through the
checkpoint's own hooks. A module that saves other tensors when recomputed than in the first
pass sets :data:`COMPACT_WHEN_RECOMPUTED` to true, so that the checkpoint does not compare the
two passes' saved tensors.

Example:
    >>> in_recomputed_region()
    False
    >>> with recomputed_region():
    ...     in_recomputed_region()
    True
    >>> with checkpoint_pass(first=True):
    ...     with checkpoint_pass(first=False, recomputation=True):   # an inner recomputation
    ...         inner = saved_tensors_dropped(), in_recomputation()
    ...     inner, saved_tensors_dropped()
    ((False, True), True)
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

_STATE = threading.local()

COMPACT_WHEN_RECOMPUTED = '_mmdropit_compact_when_recomputed'
"""The attribute of a module class whose saved tensors differ between a checkpoint's first pass
and its recomputation (compressed in the recomputation only)."""


@contextlib.contextmanager
def recomputed_region() -> Iterator[None]:
    """Mark the code inside as part of a checkpoint's region (regions may nest)."""
    _STATE.depth = getattr(_STATE, 'depth', 0) + 1
    try:
        yield
    finally:
        _STATE.depth -= 1


def in_recomputed_region() -> bool:
    """Whether a checkpoint's region is running on this thread."""
    return getattr(_STATE, 'depth', 0) > 0


@contextlib.contextmanager
def checkpoint_pass(first: bool, recomputation: bool = False) -> Iterator[None]:
    """Mark the code inside as a checkpoint's first forward pass (``first``), whose saved
    tensors the checkpoint drops, or as a pass whose saved tensors are used: a plain
    checkpoint's recomputation (``recomputation``), or either pass of a selective checkpoint
    (its recomputation replays the first pass's ops in order, so a layer must run the same ops
    in both)."""
    passes = _STATE.__dict__.setdefault('passes', [])
    passes.append('first' if first else 'recomputation' if recomputation else 'kept')
    try:
        yield
    finally:
        passes.pop()


def _innermost_pass() -> str | None:
    passes = getattr(_STATE, 'passes', None)
    return passes[-1] if passes else None


def saved_tensors_dropped() -> bool:
    """Whether the innermost checkpoint pass on this thread is a first forward pass: what is
    saved for backward now is dropped, and saved again when the region is recomputed."""
    return _innermost_pass() == 'first'


def in_recomputation() -> bool:
    """Whether the innermost checkpoint pass on this thread is a plain checkpoint's
    recomputation: what is saved now is what its backward uses."""
    return _innermost_pass() == 'recomputation'
