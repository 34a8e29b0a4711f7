"""Saved-tensor hooks that nest: what an inner hook keeps stays visible to an outer meter.

``torch.autograd.graph.saved_tensors_hooks`` applies only the innermost pair of hooks. A module
that stores its saved tensors in a form of its own (``mmdropit.codecs``' compressed activations)
therefore hides them from a hook around the whole step (``SavedTensorMeter``). The inner hook
reports each tensor it keeps to :func:`report_kept`; an outer meter that called
:func:`watching_kept` counts them as if it had packed them itself.

A meter's hooks only look (:func:`observing_saves`): :func:`storing_hooks_active` tells a
technique whether hooks that keep tensors their own way (a checkpoint, offload, codes) are on
top of autograd's stack, where it would replace them, meters left out.

Example:
    >>> seen = []
    >>> with watching_kept(seen.append):
    ...     report_kept(torch.zeros(3), torch.ones(2))
    >>> [t.tolist() for t in seen]
    [[0.0, 0.0, 0.0], [1.0, 1.0]]
    >>> report_kept(torch.zeros(1))   # nobody watching: nothing happens
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager

import torch

from .listeners import Listeners

_WATCHERS: Listeners[[torch.Tensor]] = Listeners()
_OBSERVERS: list[Callable] = []
"""The pack hooks of :func:`observing_saves` in effect."""
_TOP_HOOKS: Callable[[bool], tuple | None] | None = getattr(
    torch._C._autograd, '_top_saved_tensors_default_hooks', None)


def watching_kept(watcher: Callable[[torch.Tensor], object]) -> AbstractContextManager[None]:
    """Call ``watcher(tensor)`` for each tensor an inner saved-tensor hook keeps."""
    return _WATCHERS.listening(watcher)


def report_kept(*tensors: torch.Tensor) -> None:
    """Tell the watchers that these tensors are kept for backward."""
    if _WATCHERS:
        for tensor in tensors:
            _WATCHERS.notify(tensor)


@contextlib.contextmanager
def observing_saves(pack: Callable[[torch.Tensor], torch.Tensor]) -> Iterator[None]:
    """Saved-tensor hooks that only look: ``pack(tensor)`` returns the tensor (or a detached
    alias of it) for autograd to keep as it is."""
    with torch.autograd.graph.saved_tensors_hooks(pack, _as_kept):
        _OBSERVERS.append(pack)
        try:
            yield
        finally:
            _OBSERVERS.remove(pack)


def _as_kept(tensor: torch.Tensor) -> torch.Tensor:
    return tensor


def top_hooks() -> tuple[Callable, Callable] | None:
    """The ``(pack, unpack)`` hooks on top of autograd's saved-tensor hooks (``None``: none, or
    this torch does not say)."""
    return None if _TOP_HOOKS is None else _TOP_HOOKS(False)


def storing_hooks_active() -> bool:
    """Whether the saved-tensor hooks on top of autograd's stack keep tensors their own way
    (not those of :func:`observing_saves`)."""
    top = top_hooks()
    return top is not None and top[0] not in _OBSERVERS
