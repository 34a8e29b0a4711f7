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

OUT_OF_MEMORY = 2**62
"""Stands for a trial that ran out of memory in a maximum over the processes (see
``max_over_ranks``, which turns it back into ``None``): above any peak."""
CANNOT_TRAIN = OUT_OF_MEMORY // 2
"""Stands for a trial that raised in the peak :func:`search_split` hands its ``agree``: above
any peak, below :data:`OUT_OF_MEMORY`, so that the largest over the processes tells them all
that one could not train."""

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
    """The fewest micro-batches whose measured peak fits ``budget``, each part able to train.

    A part size whose pass raises (``RuntimeError`` or ``ValueError``, as BatchNorm on one
    sample, or Mixup on an odd part) cannot train; the smallest part is then the smallest of
    one and two samples that trains. Part sizes are taken to train as one sample does; once a
    size failed, every part size of a split is tried before it is chosen.

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
            memory, or is below the peak of the smallest part that trains (the message gives
            that peak), or no split into parts that train fits it.
    """
    if budget is None:
        raise ConfigError(f'{BUDGET_HELP}; got None')
    measured: dict[int, int | None] = {}
    failed: dict[int, Exception] = {}

    def peak(size: int) -> int | None:
        if size not in measured and size not in failed:
            try:
                measured[size] = measure(size)
            except (RuntimeError, ValueError) as error:
                if size == batch_size:
                    raise
                failed[size] = error
        return measured.get(size)

    def fits(size: int) -> bool:
        return peak(size) is not None and peak(size) <= budget_bytes

    def trains(size: int) -> bool:
        peak(size)
        return size not in failed

    def usable(count: int) -> bool:
        """Whether the largest part of ``count`` micro-batches fits and every part trains."""
        largest, *others = sorted(set(micro_batch_sizes(batch_size, count)), reverse=True)
        return fits(largest) and (not failed or all(trains(size) for size in others))

    full = peak(batch_size)
    if full is None and isinstance(budget, float):
        raise ConfigError('memory_budget is a fraction of the undivided step, which ran out of '
                          "memory: give the budget in bytes instead, e.g. memory_budget='6GB'")
    budget_bytes = resolve_budget(budget, full or 0)
    if fits(batch_size):
        return _decision(batch_size, 1, measured, budget_bytes)
    smallest = next((size for size in (1, 2) if size <= batch_size and trains(size)), None)
    if smallest is None:
        raise ConfigError(f'micro-batches of one or two samples cannot train ({failed[2]}): '
                          'split batches of more samples, or lower the memory of the whole '
                          'batch another way')
    if not fits(smallest):
        reachable = ('out of memory' if peak(smallest) is None
                     else f'{peak(smallest)} bytes ({_mib(peak(smallest))})')
        part = 'a single sample' if smallest == 1 else f'{smallest} samples'
        raise ConfigError(
            f'memory_budget {budget_bytes} bytes ({_mib(budget_bytes)}) is below the peak of '
            f'{part}, the smallest reachable: {reachable}. Raise the budget, or lower the '
            'memory of one sample first (DropITHook, CheckpointPlanHook, mixed precision)')
    predicted = _fewest_parts(batch_size, _predicted_size(batch_size, smallest,
                                                          peak(smallest), full, budget_bytes))
    count: int | None = predicted
    while count is not None and not usable(count):  # the line was optimistic: more parts
        largest = _largest_part(batch_size, count)
        count = None if largest == 1 else _fewest_parts(batch_size, largest - 1)
    fewer = predicted if count is None else count
    while fewer > 1:  # the line may have been pessimistic: fewer parts while the largest fits
        fewer = _fewest_parts(batch_size, _largest_part(batch_size, fewer - 1))
        largest = _largest_part(batch_size, fewer)
        if trains(largest) and not fits(largest):
            break
        if usable(fewer):
            count = fewer
    if count is None:  # more parts left a part that cannot train, fewer did not fit
        raise ConfigError(
            f'no split of {batch_size} samples into parts that train fits memory_budget '
            f'{_mib(budget_bytes)}: parts of {sorted(failed)} samples cannot '
            f'({next(iter(failed.values()))}); change the batch size or the budget')
    return _decision(batch_size, count, measured, budget_bytes)


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
            largest over all ranks, so that all take the same decision; a trial that raised
            hands it :data:`CANNOT_TRAIN`, and every process then treats the size as one that
            cannot train); ``None``: as measured.

    Returns:
        The decision, with every measurement made.
    """
    def measure(size: int) -> int | None:
        try:
            peak, failure = trial_peak(lambda: run_part(size), model, optimizer), None
        except (RuntimeError, ValueError) as error:  # e.g. BatchNorm on one sample
            peak, failure = CANNOT_TRAIN, error
        if agree is not None:
            peak = agree(peak)
        if failure is not None:
            raise failure
        if peak is not None and peak >= CANNOT_TRAIN:
            raise ValueError(f'another process could not train a part of {size} samples')
        return peak

    return smallest_split(batch_size, measure, budget)


def _predicted_size(batch_size: int, smallest: int, small: int | None, full: int | None,
                    budget_bytes: int) -> int:
    """The largest part size under the line through (``smallest``, ``small``) and (batch,
    ``full``); a part that is a whole number of micro-batches; ``smallest`` when the full
    batch ran out of memory."""
    if full is None or small is None or full <= small:
        return smallest
    per_sample = (full - small) / (batch_size - smallest)
    largest = max(smallest, min(batch_size - 1,
                                smallest + int((budget_bytes - small) / per_sample)))
    return _largest_part(batch_size, _fewest_parts(batch_size, largest))


def _decision(batch_size: int, micro_batches: int, measured: dict[int, int | None],
              budget_bytes: int) -> SplitDecision:
    size = _largest_part(batch_size, micro_batches)
    return SplitDecision(batch_size, micro_batches, size, measured[size], budget_bytes,
                         dict(measured))
