"""Listeners that code running deep inside a step tells what it does, for as long as they listen.

A meter or recorder around a step (the saved-tensor meter, the checkpoint recorder, the audit)
listens with :meth:`Listeners.listening`; the code it watches calls :meth:`Listeners.notify`.
Listeners is a list, so on a hot path ``if listeners:`` costs what an empty list's check costs
and the notification is skipped when nobody listens.

Example:
    >>> heard = []
    >>> sizes: Listeners[[int]] = Listeners()
    >>> with sizes.listening(heard.append):
    ...     sizes.notify(4096)
    >>> sizes.notify(8)  # nobody listens: nothing happens
    >>> heard, bool(sizes)
    ([4096], False)
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Generic, ParamSpec

P = ParamSpec('P')


class Listeners(list[Callable[P, object]], Generic[P]):
    """The listeners of one kind of event, each called with the event's arguments."""

    @contextlib.contextmanager
    def listening(self, listener: Callable[P, object]) -> Iterator[None]:
        """Call ``listener`` with the arguments of each :meth:`notify` inside the block."""
        self.append(listener)
        try:
            yield
        finally:
            self.remove(listener)

    def notify(self, *args: P.args, **kwargs: P.kwargs) -> None:
        """Call every listener with these arguments, the first to listen first."""
        for listener in self:
            listener(*args, **kwargs)
