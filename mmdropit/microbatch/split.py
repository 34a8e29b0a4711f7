"""Choose how many micro-batches a batch is split into so that the measured peak fits a budget.

The search measures, it does not trust a model: ``measure(size)`` runs a real forward and
backward pass of ``size`` samples and returns its peak. The undivided batch is measured first
(it fixes a fractional budget), then one sample (the floor: nothing smaller exists), then the
split that a straight line through those two points predicts, corrected up or down by further
measurements until the smallest fitting number of micro-batches is found among the measured ones.

Example:
    >>> peaks = {size: 1000 + 100 * size for size in range(1, 65)}   # a fake, linear model
    >>> decision = smallest_split(64, peaks.__getitem__, budget=0.5)
    >>> decision.micro_batches, decision.micro_batch_size
    (3, 22)
    >>> decision.peak_bytes <= decision.budget_bytes
    True
    >>> micro_batch_sizes(10, 4)
    [3, 3, 2, 2]
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import torch
from torch import nn

from ..common.budget import Budget, resolve_budget
from ..common.units import mib
from ..errors import ConfigError
from ..memory.trial_peak import trial_peak

BUDGET_HELP = ("a micro-batch memory_budget is a fraction of the undivided step's measured peak "
               "such as 0.5, or a size such as '6GB' or '512MiB'")


@dataclass(frozen=True)
class SplitDecision:
    """The chosen split and the measurements behind it.

    Attributes:
        batch_size: Samples in the loaded batch.
        micro_batches: Number of micro-batches.
        micro_batch_size: Samples in the largest micro-batch.
        peak_bytes: Measured peak of the largest micro-batch's step.
        budget_bytes: The budget in bytes.
        measured: Measured peak (bytes, ``None`` for out of memory) per micro-batch size.
    """

    batch_size: int
    micro_batches: int
    micro_batch_size: int
    peak_bytes: int
    budget_bytes: int
    measured: dict[int, int | None] = field(default_factory=dict)

    def __str__(self) -> str:
        tried = ', '.join(f'{size}: {_mib(peak)}' for size, peak in sorted(self.measured.items()))
        return (f'{self.micro_batches} micro-batch(es) of at most {self.micro_batch_size} of '
                f'{self.batch_size} samples: measured peak {_mib(self.peak_bytes)} within the '
                f'budget {_mib(self.budget_bytes)} (peaks measured per micro-batch size: {tried})')


def _mib(nbytes: int | None) -> str:
    return 'out of memory' if nbytes is None else mib(nbytes)


def micro_batch_sizes(batch_size: int, micro_batches: int) -> list[int]:
    """Split ``batch_size`` samples into ``micro_batches`` parts differing by at most one."""
    if not 1 <= micro_batches <= batch_size:
        raise ConfigError(f'cannot split a batch of {batch_size} samples into {micro_batches} '
                          f'micro-batches: use 1 to {batch_size} micro-batches or a larger batch')
    share, extra = divmod(batch_size, micro_batches)
    return [share + 1] * extra + [share] * (micro_batches - extra)


def _largest_part(batch_size: int, micro_batches: int) -> int:
    return math.ceil(batch_size / micro_batches)


def _fewest_parts(batch_size: int, largest: int) -> int:
    """The fewest micro-batches whose largest part holds at most ``largest`` samples."""
    return math.ceil(batch_size / largest)


def smallest_split(batch_size: int, measure: Callable[[int], int | None],
                   budget: Budget) -> SplitDecision:
    """The fewest micro-batches whose measured peak fits ``budget``.

    Args:
        batch_size: Samples in the loaded batch.
        measure: Runs a training forward and backward of that many samples and returns the
            peak in bytes, or ``None`` when it ran out of memory. Called a few times (each size
            at most once), in the same order on every process when the answers agree.
        budget: A fraction of the undivided batch's peak (float in (0, 1]) or bytes (int), as
            :func:`~mmdropit.common.parse_budget` returns them (with :data:`BUDGET_HELP`).

    Returns:
        The decision, with every measurement made.

    Raises:
        ConfigError: The budget is ``None``, is a fraction while the undivided batch ran out of
            memory, or is below the peak of a single sample (the message gives that peak).
    """
    if budget is None:
        raise ConfigError(f'{BUDGET_HELP}; got None')
    measured: dict[int, int | None] = {}

    def peak(size: int) -> int | None:
        if size not in measured:
            measured[size] = measure(size)
        return measured[size]

    def fits(size: int) -> bool:
        return peak(size) is not None and peak(size) <= budget_bytes

    full = peak(batch_size)
    if full is None and isinstance(budget, float):
        raise ConfigError('memory_budget is a fraction of the undivided step, which ran out of '
                          "memory: give the budget in bytes instead, e.g. memory_budget='6GB'")
    budget_bytes = resolve_budget(budget, full or 0)
    if fits(batch_size):
        return _decision(batch_size, 1, measured, budget_bytes)
    if not fits(1):
        reachable = 'out of memory' if peak(1) is None else f'{peak(1)} bytes ({_mib(peak(1))})'
        raise ConfigError(
            f'memory_budget {budget_bytes} bytes ({_mib(budget_bytes)}) is below the peak of a '
            f'single sample, the smallest reachable: {reachable}. Raise the budget, or lower the '
            'memory of one sample first (DropITHook, CheckpointPlanHook, mixed precision)')
    size = _predicted_size(batch_size, peak(1), full, budget_bytes)
    while not fits(size):  # the line was optimistic: shrink until a measurement fits
        size = _largest_part(batch_size, _fewest_parts(batch_size, size - 1))
    while True:  # the line may have been pessimistic: grow while the next larger part fits
        fewer = _fewest_parts(batch_size, size) - 1
        if fewer < 1 or not fits(_largest_part(batch_size, fewer)):
            break
        size = _largest_part(batch_size, fewer)
    return _decision(batch_size, _fewest_parts(batch_size, size), measured, budget_bytes)


def search_split(batch_size: int, run_part: Callable[[int], object], model: nn.Module,
                 optimizer: torch.optim.Optimizer | None, budget: Budget,
                 agree: Callable[[int | None], int | None] | None = None) -> SplitDecision:
    """The fewest micro-batches whose trial peak, measured with
    :func:`~mmdropit.memory.trial_peak.trial_peak`, fits ``budget``.

    The one search behind ``MicroBatchOptimWrapper(memory_budget=...)`` and the benchmark's
    ``micro-budget`` variant.

    Args:
        batch_size: Samples in the loaded batch.
        run_part: ``run_part(size)`` runs the forward and backward pass of the batch's first
            ``size`` samples, its loss weighted by ``size / batch_size`` (no optimizer step).
        model: The trained model (unwrapped): its gradients, buffers and RNG are restored after
            each trial.
        optimizer: Its optimizer (its state counts in the peak).
        budget: As for :func:`smallest_split`.
        agree: Turns this process's measured peak into the one every process uses (e.g. the
            largest over all ranks, so that all take the same decision); ``None``: as measured.

    Returns:
        The decision, with every measurement made.
    """
    def measure(size: int) -> int | None:
        peak = trial_peak(lambda: run_part(size), model, optimizer)
        return peak if agree is None else agree(peak)

    return smallest_split(batch_size, measure, budget)


def _predicted_size(batch_size: int, one: int, full: int | None, budget_bytes: int) -> int:
    """The largest part size under the line through (1, ``one``) and (batch, ``full``); a part
    that is a whole number of micro-batches; 1 when the full batch ran out of memory."""
    if full is None or full <= one:
        return 1
    per_sample = (full - one) / (batch_size - 1)
    largest = max(1, min(batch_size - 1, 1 + int((budget_bytes - one) / per_sample)))
    return _largest_part(batch_size, _fewest_parts(batch_size, largest))


def _decision(batch_size: int, micro_batches: int, measured: dict[int, int | None],
              budget_bytes: int) -> SplitDecision:
    size = _largest_part(batch_size, micro_batches)
    return SplitDecision(batch_size, micro_batches, size, measured[size], budget_bytes,
                         dict(measured))
