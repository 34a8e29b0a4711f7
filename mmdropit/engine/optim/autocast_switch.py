"""A switch for autocast on any optim wrapper, so that a hook can turn bfloat16 on and off.

``MemoryBudgetHook`` adds :class:`AutocastSwitch` to the class of the runner's optim wrapper
(in place, keeping its optimizer and settings) when it may try bfloat16 autocast, and sets
:attr:`~AutocastSwitch.switched_precision` when its decision takes it. bfloat16 needs no loss
scaling; float16 is left to :class:`~.MixedPrecisionOptimWrapper`, which scales the loss.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator

from torch import nn

from ...common.parameters import model_device
from ...precision import MixedPrecisionConfig


class AutocastSwitch:
    """Mixin for an ``OptimWrapper`` subclass: ``optim_context`` also enters the autocast of
    :attr:`switched_precision` when it is set (``None``: off, the default)."""

    switched_precision: MixedPrecisionConfig | None = None

    @contextlib.contextmanager
    def optim_context(self, model: nn.Module) -> Iterator[None]:
        with super().optim_context(model):
            if self.switched_precision is None:
                yield
                return
            with self.switched_precision.autocast(model_device(model).type):
                yield
