"""What a memory budget's techniques are applied to in tests: a bare model and its micro-batch
count (``mmdropit.planner.Target``)."""
from __future__ import annotations

from torch import nn


class SplitTarget:
    """The model and the number of micro-batches the budget chose for it."""

    def __init__(self, model: nn.Module) -> None:
        self.model, self.micro_batches = model, 1

    def set_micro_batches(self, count: int) -> None:
        self.micro_batches = count
