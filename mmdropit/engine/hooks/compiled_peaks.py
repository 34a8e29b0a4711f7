"""The peak of a compiled training step, measured once per input-shape bucket and decision
(:class:`CompiledPeaks`), for hooks that decide on eager passes and train compiled."""
from __future__ import annotations

import torch
from torch import nn

from ...memory import CompiledStepPeakMeter
from .shape_buckets import ShapeKey


class CompiledPeaks:
    """Measures the peak of one compiled step of each bucket's decision: the second iteration
    run under it (the first traces and compiles it), with
    :class:`~mmdropit.memory.CompiledStepPeakMeter`.

    Call :meth:`entered` whenever a decision is put in effect, :meth:`start` before each
    iteration and :meth:`stop` after it.

    Args:
        model: The trained model.
        optimizer: Its optimizer.

    Attributes:
        measured: The measured peak of each bucket whose decision is kept.
        corrections: How many times each bucket's decision was made again after its compiled
            step measured above the budget (kept by the caller).
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None) -> None:
        self.model, self.optimizer = model, optimizer
        self.measured: dict[ShapeKey, int] = {}
        self.corrections: dict[ShapeKey, int] = {}
        self._run_since_entered = 0
        self._meter: CompiledStepPeakMeter | None = None

    def entered(self) -> None:
        """A decision was put in effect: the next iteration traces it again."""
        self._run_since_entered = 0

    def start(self, key: ShapeKey) -> None:
        """Before an iteration of the bucket ``key``: measure it if its decision has been
        compiled and not measured yet."""
        if key not in self.measured and self._run_since_entered >= 1:
            self._meter = CompiledStepPeakMeter(self.model, self.optimizer)
            self._meter.start()

    def stop(self) -> int | None:
        """After the iteration: its peak when it was measured, else ``None``."""
        self._run_since_entered += 1
        if self._meter is None:
            return None
        meter, self._meter = self._meter, None
        return meter.stop()
