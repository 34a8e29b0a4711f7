"""Whether the code running now is inside a region a checkpoint recomputes, and in which pass.

A checkpoint drops every tensor saved inside its region and recomputes it in the backward pass;
a module that stores its saved tensors compactly (:mod:`mmdropit.codecs.activations`) would, as
the innermost saved-tensor hook, keep its codes there instead of letting them be dropped, and
its hooks would hide the recomputed tensors from the checkpoint. The checkpoint wrapper
(:mod:`mmdropit.checkpoint.apply`) therefore marks its region, in the first forward pass and in
the recomputation, and such modules hand what they save to the checkpoint's hooks there
(:mod:`mmdropit.codecs.recomputed`), or step aside in a selective checkpoint. The mark is per
thread: autograd may recompute on another thread than the forward pass's.

Within a region, the first forward pass's saved tensors are dropped at once and only the
recomputation's are used (:func:`saved_tensors_dropped`): a DropIT layer saves placeholders of
the right shapes there instead of selecting twice. A plain checkpoint's recomputation is marked
too (:func:`in_recomputation`): a compressed module stores its codes there, through the
checkpoint's own hooks.

The passes of ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)`` called by the
model itself (timm's ``set_grad_checkpointing()``) count as a plain checkpoint's: they are told
by the saved-tensor hooks on top of autograd's stack, which are that checkpoint's own while its
region runs (its first pass's pack drops what it is given, its recomputation's keeps it). A
mark of :func:`checkpoint_pass` notes the hooks on top when it was made: while they are still
on top, the mark is the innermost pass; a checkpoint called inside it pushes new ones. (A
reentrant checkpoint runs its first pass without autograd: nothing is saved there.)

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
from collections.abc import Callable, Iterator

import torch

from .saved_tensors import top_hooks


class _Marks(threading.local):
    """This thread's marks: the depth of nested regions, and the checkpoint passes, innermost
    last, each with the pack hook on top when it was marked. Set on each thread's first use,
    so reading them never misses (dynamo fails on a thread-local attribute read with a
    default, and then runs the checkpoint's whole region outside the graph)."""

    def __init__(self) -> None:
        super().__init__()
        self.depth = 0
        self.passes: list[tuple[str, Callable | None]] = []


_STATE = _Marks()
_TORCH_PASSES = {'_checkpoint_hook.__init__.<locals>.pack_hook': 'first',
                 '_recomputation_hook.__init__.<locals>.pack_hook': 'recomputation'}
"""The pack hooks of ``torch.utils.checkpoint``'s non-reentrant checkpoint by qualified name,
and the pass each marks."""


@contextlib.contextmanager
def recomputed_region() -> Iterator[None]:
    """Mark the code inside as part of a checkpoint's region (regions may nest): a compiled
    checkpoint's passes, and a recorded step (an eager checkpoint's pass marks mark its region,
    :func:`checkpoint_pass`). A generator's context: dynamo traces it inside compiled
    checkpoints, and refused a class's."""
    _STATE.depth += 1
    try:
        yield
    finally:
        _STATE.depth -= 1


def in_recomputed_region() -> bool:
    """Whether a checkpoint's region is running on this thread."""
    return _STATE.depth > 0


class _PassMark:
    """The context of :func:`checkpoint_pass` (a class: cheaper than a generator's, also where
    torch's checkpoint stops a recomputation early by raising through it), entered by a
    compressed module inside a checkpoint's pass; an eager checkpoint's own passes enter
    :class:`_RegionPassMark`. A compiled checkpoint is one of dynamo's regions, without these
    marks."""

    def __init__(self, name: str) -> None:
        self.name = name

    def __enter__(self) -> None:
        _STATE.passes.append((self.name, _top_pack()))

    def __exit__(self, *exc: object) -> None:
        _STATE.passes.pop()


class _RegionPassMark(_PassMark):
    """:class:`_PassMark` around a checkpoint's whole region, marked as
    :func:`recomputed_region` marks it too. Entered only by an eager checkpoint (see
    :func:`checkpoint_pass`), so the hooks on top are read without asking whether dynamo
    traces."""

    def __enter__(self) -> None:
        hooks = top_hooks()
        _STATE.passes.append((self.name, None if hooks is None else hooks[0]))
        _STATE.depth += 1

    def __exit__(self, *exc: object) -> None:
        _STATE.depth -= 1
        _STATE.passes.pop()


def checkpoint_pass(first: bool, recomputation: bool = False,
                    region: bool = False) -> contextlib.AbstractContextManager:
    """Mark the code inside as a checkpoint's first forward pass (``first``), whose saved
    tensors the checkpoint drops, or as a pass whose saved tensors are used: a plain
    checkpoint's recomputation (``recomputation``), or either pass of a selective checkpoint
    (its recomputation replays the first pass's ops in order, so a layer must run the same ops
    in both). ``region``: the mark is around the checkpoint's whole region, as the contexts an
    eager ``torch.utils.checkpoint`` enters around each pass are, and marks it as
    :func:`recomputed_region` would (one context a pass instead of two); not while dynamo
    traces (it reads autograd's hooks without asking), and only where the checkpoint runs with
    grad enabled (torch's checkpoint enters no context otherwise)."""
    name = 'first' if first else 'recomputation' if recomputation else 'kept'
    return _REGION_MARKS[name] if region else _PassMark(name)


_REGION_MARKS = {name: _RegionPassMark(name) for name in ('first', 'recomputation', 'kept')}
"""The region marks, one of each pass (they hold nothing between their entry and exit)."""


def _top_pack() -> Callable | None:
    """The pack hook on top of autograd's saved-tensor hooks (``None``: none, this torch does
    not say, or dynamo is tracing: it takes checkpoints as regions of its own, and only the
    marks count)."""
    if torch.compiler.is_compiling():
        return None
    hooks = top_hooks()
    return None if hooks is None else hooks[0]


def _torch_checkpoint_pass(pack: Callable | None) -> str | None:
    """``'first'`` or ``'recomputation'`` where ``pack`` is the pack hook of that pass of
    ``torch.utils.checkpoint``'s non-reentrant checkpoint, else ``None``."""
    if pack is None or getattr(pack, '__module__', None) != 'torch.utils.checkpoint':
        return None
    return _TORCH_PASSES.get(pack.__qualname__)


def innermost_pass() -> str | None:
    """The innermost checkpoint pass on this thread (``'first'``, ``'recomputation'``,
    ``'kept'`` or ``None``: see :func:`checkpoint_pass`): a mark of :func:`checkpoint_pass`
    whose hooks are still on top, or a non-reentrant ``torch.utils.checkpoint`` pass inside it
    (or outside any mark). One query where a caller needs the pass itself, not one answer."""
    passes = _STATE.passes
    pack = _top_pack()
    if passes and passes[-1][1] is pack:
        return passes[-1][0]
    torch_pass = _torch_checkpoint_pass(pack)
    if torch_pass is not None:
        return torch_pass
    return passes[-1][0] if passes else None


def saved_tensors_dropped() -> bool:
    """Whether the innermost checkpoint pass on this thread is a first forward pass: what is
    saved for backward now is dropped, and saved again when the region is recomputed."""
    return innermost_pass() == 'first'


def in_recomputation() -> bool:
    """Whether the innermost checkpoint pass on this thread is a plain checkpoint's
    recomputation: what is saved now is what its backward uses."""
    return innermost_pass() == 'recomputation'


def saved_until_backward() -> bool:
    """Whether what autograd saves now on this thread waits for a later backward pass, so that
    keeping it elsewhere until then (host memory) can pay: not inside a checkpoint's region or
    pass (a plain checkpoint drops what its first pass saves, and what its recomputation saves
    is used at once), nor in a backward pass (a reentrant checkpoint's recomputation, mmdet's
    ``with_cp=True``)."""
    return not (in_recomputed_region() or in_plain_checkpoint()
                or torch._C._current_graph_task_id() != -1)


def in_plain_checkpoint() -> bool:
    """Whether the innermost checkpoint pass on this thread is a plain checkpoint's first pass
    or recomputation: what is saved now must have the shapes the other pass saves."""
    return innermost_pass() in ('first', 'recomputation')
