"""A training workload to measure: a model, a fixed batch, and what was searched for it once.

Example:
    >>> from torch import nn
    >>> net = nn.Linear(8, 2)
    >>> x, y = torch.randn(6, 8), torch.randn(6, 2)
    >>> work = Workload('linear', net, lambda: (net(x) - y).pow(2).mean(),
    ...                 set_grad_checkpointing=lambda on: None, batch_size=6,
    ...                 part_loss=lambda first, size: (net(x[first:first + size])
    ...                                                - y[first:first + size]).pow(2).mean()
    ...                                                * size / 6)
    >>> work.micro_batches = 4
    >>> round(sum(loss().item() for loss in work.losses()), 5) == round(work.loss().item(), 5)
    True
"""
from __future__ import annotations

import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
from torch import nn

from ..checkpoint import CheckpointPlan
from ..microbatch import SplitDecision, micro_batch_sizes
from ..planner import BudgetOutcome
from ..precision import MixedPrecisionConfig


@dataclass
class Workload:
    """A model and a fixed batch: everything one training step needs.

    Attributes:
        name: Short model name used in the table, e.g. ``'deit_tiny'``.
        model: The model, on the measured device, in train mode.
        loss: Runs the forward pass on the fixed batch and returns the scalar loss.
        set_grad_checkpointing: Switches the library's own activation checkpointing on or off.
        batch_size: Samples in the fixed batch.
        part_loss: ``part_loss(first, size)``: the loss of samples ``first .. first+size-1``
            weighted by their share of the batch (the parts' losses add up to the batch loss);
            ``None`` when the workload cannot be split.
        micro_batches: How many parts a training step runs the batch as (one forward and
            backward each, then one optimizer step); variants may change it.
        optimizer: The optimizer of the measured steps (set by the harness).
        plans: Checkpoint plans searched for this workload (once, outside the timer), by the
            settings of the variant that searched them.
        split_decisions: Micro-batch splits searched for this workload, by memory budget.
        budget_outcomes: Memory-budget decisions made for this workload, by variant name.
        offloaded: The modules chosen to hold each share of the saved bytes (activation
            offload), by share.
        switched_precision: The autocast of the forward passes when a budget decision turned
            it on (``None``: off).
        graph_breaks: Graph breaks ``torch.compile`` made in each variant's measured steps, by
            variant name (a compiled run only).
        compiled_forward: The model's forward compiled by a compiled variant, kept for the
            others (``None``: not yet).
    """

    name: str
    model: nn.Module
    loss: Callable[[], torch.Tensor]
    set_grad_checkpointing: Callable[[bool], None]
    batch_size: int = 1
    part_loss: Callable[[int, int], torch.Tensor] | None = None
    micro_batches: int = 1
    optimizer: torch.optim.Optimizer | None = None
    plans: dict[str, CheckpointPlan] = field(default_factory=dict)
    split_decisions: dict[float | int, SplitDecision] = field(default_factory=dict)
    budget_outcomes: dict[str, BudgetOutcome] = field(default_factory=dict)
    offloaded: dict[float, tuple[str, ...]] = field(default_factory=dict)
    switched_precision: MixedPrecisionConfig | None = None
    graph_breaks: dict[str, int] = field(default_factory=dict)
    compiled_forward: Callable | None = None

    def compile(self, **options) -> None:
        """Compile the model's forward in place (``torch.compile(model.forward, **options)``):
        the loss closures call the model, so every later step runs compiled.

        Not ``nn.Module.compile()``: that compiles the module's ``_call_impl``, a frame of
        ``torch.nn`` that dynamo (torch 2.13) skips, compiling instead the first frame outside
        torch it meets -- all of a timm model's forward, but nothing of an ``nn.Sequential``.
        """
        self.model.forward = torch.compile(self.model.forward, **options)

    def set_micro_batches(self, count: int) -> None:
        """Run the batch as ``count`` micro-batches (what a memory-budget decision sets)."""
        self.micro_batches = count

    def losses(self) -> Iterator[Callable[[], torch.Tensor]]:
        """One closure per micro-batch, each returning its weighted loss."""
        if self.micro_batches == 1:
            yield self.loss
            return
        if self.part_loss is None:
            raise NotImplementedError(f'{self.name} cannot be split into micro-batches')
        first = 0
        for size in micro_batch_sizes(self.batch_size, self.micro_batches):
            yield functools.partial(self.part_loss, first, size)
            first += size
