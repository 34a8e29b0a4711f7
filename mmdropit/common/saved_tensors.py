"""Saved-tensor hooks that nest: what an inner hook keeps stays visible to an outer meter.

``torch.autograd.graph.saved_tensors_hooks`` applies only the innermost pair of hooks. A module
that stores its saved tensors in a form of its own (``mmdropit.codecs``' compressed activations)
therefore hides them from a hook around the whole step (``SavedTensorMeter``). The inner hook
reports each tensor it keeps to :func:`report_kept`; an outer meter that called
:func:`watching_kept` counts them as if it had packed them itself.

Example:
    >>> seen = []
    >>> with watching_kept(seen.append):
    ...     report_kept(torch.zeros(3), torch.ones(2))
    >>> [t.tolist() for t in seen]
    [[0.0, 0.0, 0.0], [1.0, 1.0]]
    >>> report_kept(torch.zeros(1))   # nobody watching: nothing happens
"""
from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

import torch

from .listeners import Listeners

_WATCHERS: Listeners[[torch.Tensor]] = Listeners()


def watching_kept(watcher: Callable[[torch.Tensor], object]) -> AbstractContextManager[None]:
    """Call ``watcher(tensor)`` for each tensor an inner saved-tensor hook keeps."""
    return _WATCHERS.listening(watcher)


def report_kept(*tensors: torch.Tensor) -> None:
    """Tell the watchers that these tensors are kept for backward."""
    if _WATCHERS:
        for tensor in tensors:
            _WATCHERS.notify(tensor)
