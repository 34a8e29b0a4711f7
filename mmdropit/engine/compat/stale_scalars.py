"""Scalars of one run that a resumed run must not inherit.

MMEngine saves the message hub's log scalars in every checkpoint and restores them on resume;
``LoggerHook`` then logs every ``train/`` scalar at each interval. A run without DropIT resumed
from a DropIT checkpoint thus logged the old run's last ``dropit_keep_ratio`` on every line.
This shim drops :data:`PER_ITERATION` scalars when a message hub is loaded: they describe one
iteration, and ``DropITHook`` writes a fresh one at every iteration of a run that has it.
"""
from __future__ import annotations

import functools

PER_ITERATION = ('train/dropit_keep_ratio',)


def install() -> None:
    """Patch ``MessageHub.load_state_dict`` (safe to call more than once)."""
    from mmengine.logging import MessageHub

    load = MessageHub.load_state_dict
    if getattr(load, '_mmdropit_drops_stale', False):
        return

    @functools.wraps(load)
    def load_state_dict(self, state_dict) -> None:
        load(self, state_dict)
        for key in PER_ITERATION:
            self._log_scalars.pop(key, None)

    load_state_dict._mmdropit_drops_stale = True
    MessageHub.load_state_dict = load_state_dict
