"""A test-only hook: one rank sleeps before training, as a hung rank would."""
from __future__ import annotations

import time

from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class SleepHook(Hook):
    """Rank ``rank`` sleeps ``seconds`` before training starts."""

    def __init__(self, rank: int, seconds: float) -> None:
        self.rank = rank
        self.seconds = seconds

    def before_train(self, runner) -> None:
        if get_rank() == self.rank:
            time.sleep(self.seconds)
