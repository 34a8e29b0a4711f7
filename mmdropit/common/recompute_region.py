"""Whether the code running now is inside a region a checkpoint recomputes.

A checkpoint drops every tensor saved inside its region and recomputes it in the backward pass;
a module that stores its saved tensors compactly (:mod:`mmdropit.codecs.activations`) would, as
the innermost saved-tensor hook, keep its codes there instead of letting them be dropped, and
its hooks would hide the recomputed tensors from the checkpoint. The checkpoint wrapper
(:mod:`mmdropit.checkpoint.apply`) therefore marks its region, in the first forward pass and in
the recomputation, and such modules step aside inside it. The mark is per thread: autograd may
recompute on another thread than the forward pass's.

Example:
    >>> in_recomputed_region()
    False
    >>> with recomputed_region():
    ...     in_recomputed_region()
    True
"""
from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator

_STATE = threading.local()


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
