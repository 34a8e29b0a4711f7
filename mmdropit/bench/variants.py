"""Memory techniques to compare with a baseline, applied to a training workload.

A :class:`Workload` is a model with a fixed batch; a :class:`Variant` is a technique (a context
manager that applies it to the workload and undoes it). Later techniques (DropIT, checkpoint plans)
join the table with :func:`register_variant`.
"""
from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import ContextManager

import torch
from torch import nn

from .micro_batches import micro_batch_sizes

BASELINE = 'baseline'


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
        optimizer: The optimizer of the measured steps (set by the benchmark).
    """

    name: str
    model: nn.Module
    loss: Callable[[], torch.Tensor]
    set_grad_checkpointing: Callable[[bool], None]
    batch_size: int = 1
    part_loss: Callable[[int, int], torch.Tensor] | None = None
    micro_batches: int = 1
    optimizer: torch.optim.Optimizer | None = None

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


@dataclass(frozen=True)
class Variant:
    """A memory technique to compare with the baseline.

    Attributes:
        name: Name in the table and on the command line.
        prepare: ``prepare(workload)`` is entered around each measured step, outside the timer:
            it changes the model (e.g. converts layers) and restores it on exit.
        forward: ``forward(workload)`` is entered around the forward pass only (e.g. autocast).
    """

    name: str
    prepare: Callable[[Workload], ContextManager[None]]
    forward: Callable[[Workload], ContextManager[None]]


VARIANTS: dict[str, Variant] = {}


def _nothing(work: Workload) -> ContextManager[None]:
    return contextlib.nullcontext()


def register_variant(name: str, prepare: Callable[[Workload], ContextManager[None]] = _nothing,
                     forward: Callable[[Workload], ContextManager[None]] = _nothing) -> Variant:
    """Add a variant to :data:`VARIANTS` (in table order) and return it.

    Args:
        name: Name in the table and for ``--variants``.
        prepare: Context manager factory that applies the technique to the model and undoes it.
        forward: Context manager factory entered around the forward pass.

    Returns:
        The registered :class:`Variant`.

    Example:
        >>> @contextlib.contextmanager
        ... def channels_last(work):
        ...     work.model.to(memory_format=torch.channels_last)
        ...     try:
        ...         yield
        ...     finally:
        ...         work.model.to(memory_format=torch.contiguous_format)
        >>> register_variant('channels-last', prepare=channels_last).name
        'channels-last'
        >>> del VARIANTS['channels-last']  # the example leaves the table as it was
    """
    if name in VARIANTS:
        raise ValueError(f'variant {name!r} is already registered')
    VARIANTS[name] = Variant(name, prepare, forward)
    return VARIANTS[name]


@contextlib.contextmanager
def _grad_checkpointing(work: Workload) -> Iterator[None]:
    work.set_grad_checkpointing(True)
    try:
        yield
    finally:
        work.set_grad_checkpointing(False)


def _bf16_autocast(work: Workload) -> ContextManager[None]:
    device_type = next(work.model.parameters()).device.type
    return torch.autocast(device_type, dtype=torch.bfloat16)


register_variant(BASELINE)
register_variant('grad-ckpt', prepare=_grad_checkpointing)
register_variant('bf16-autocast', forward=_bf16_autocast)
