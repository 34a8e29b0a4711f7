"""The start/stop protocol that every meter of this package follows."""
from __future__ import annotations

from abc import ABC, abstractmethod
from types import TracebackType
from typing import Generic, TypeVar

R = TypeVar('R')


class Meter(ABC, Generic[R]):
    """A measurement over a region of code, with a result once it has stopped.

    Use a meter as a context manager, or call :meth:`start` and :meth:`stop` from two places
    (e.g. the ``before_train_iter`` and ``after_train_iter`` of an MMEngine hook). Subclasses
    implement :attr:`running`, :meth:`_start` and :meth:`_stop`.
    """

    def __init__(self) -> None:
        self._result: R | None = None

    @property
    @abstractmethod
    def running(self) -> bool:
        """Whether the meter is between :meth:`start` and :meth:`stop`."""

    @abstractmethod
    def _start(self) -> None:
        """Begin measuring."""

    @abstractmethod
    def _stop(self) -> R:
        """End measuring and return the result."""

    @property
    def result(self) -> R:
        """The result of the last finished measurement.

        Raises:
            RuntimeError: If no measurement has finished yet.
        """
        if self._result is None:
            raise RuntimeError(
                f'{type(self).__name__} has no result yet: call start() and stop() first')
        return self._result

    def start(self) -> None:
        """Begin measuring.

        Raises:
            RuntimeError: If the meter is already running.
        """
        if self.running:
            raise RuntimeError(f'{type(self).__name__} is already running')
        self._start()

    def stop(self) -> R:
        """Stop measuring and return the result (also kept in :attr:`result`).

        Raises:
            RuntimeError: If the meter is not running.
        """
        if not self.running:
            raise RuntimeError(f'{type(self).__name__}.stop() called before start()')
        self._result = self._stop()
        return self._result

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 traceback: TracebackType | None) -> None:
        self.stop()
