"""Bytes a layer's backward pass allocates beyond what it saved, announced in its forward pass.

A DropIT layer saves its input compactly and rebuilds it densely in backward for the weight
gradient: for that moment the dense input is alive again, on top of the gradients. The
checkpoint recorder (:mod:`mmdropit.checkpoint.record`) listens while it records a step and
files each announcement under the module call that made it, so the cost model counts the
rebuilt input in that call's backward.

Example:
    >>> noted = []
    >>> with observe_workspace(noted.append):
    ...     note_workspace(4096)
    >>> note_workspace(8)  # nobody listens: nothing happens
    >>> noted
    [4096]
"""
from __future__ import annotations

from collections.abc import Callable
from contextlib import AbstractContextManager

from .listeners import Listeners

_LISTENERS: Listeners[[int]] = Listeners()


def observe_workspace(listener: Callable[[int], None]) -> AbstractContextManager[None]:
    """Call ``listener(nbytes)`` for each :func:`note_workspace` inside."""
    return _LISTENERS.listening(listener)


def note_workspace(nbytes: int) -> None:
    """Announce that the backward pass of the running layer allocates ``nbytes`` at once."""
    if _LISTENERS:
        _LISTENERS.notify(nbytes)
