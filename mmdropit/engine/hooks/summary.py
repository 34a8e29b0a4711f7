"""One line per mmdropit hook that says what it did, so that ``grep mmdropit:`` finds them.

A run's log opens with MMEngine's environment and config dump (some 200 lines); each hook of
the plugin that decided something logs, after the first training iteration that gives it
something to say, one line starting with :data:`PREFIX` and its class name, e.g.::

    mmdropit: DropITHook: DropIT on 16 layers, 0 lean activations; left exact: 2 excluded,
    0 frozen (gamma 0.9, strategy 'mink'); the first iteration kept 0.100 of the saved inputs

MMEngine's logger writes it on rank 0 only (other ranks log errors alone).
"""
from __future__ import annotations

from mmengine.hooks import Hook

PREFIX = 'mmdropit:'
"""How every summary line starts."""


def summary_line(hook: Hook, text: str) -> str:
    """``text`` as ``hook``'s summary line: ``'mmdropit: <hook class>: <text>'``."""
    return f'{PREFIX} {type(hook).__name__}: {text}'


class SummaryHook(Hook):
    """A hook that logs one summary line (:func:`summary_line`) after the first training
    iteration for which :meth:`summary` has something to say.

    Subclasses implement :meth:`summary`; one that defines ``after_train_iter`` calls this
    class's at its end, once what the summary reports is known.
    """

    _summarised = False  # set on the instance once its line is logged

    def summary(self, runner) -> str | None:
        """What the hook did, in one line (``None``: nothing to say yet)."""
        raise NotImplementedError

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if self._summarised:
            return
        text = self.summary(runner)
        if text is not None:
            runner.logger.info(summary_line(self, text))
            self._summarised = True
