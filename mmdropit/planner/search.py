"""Combine techniques under one memory budget: predict every combination, take the fastest that
fits with a margin, measure it, and tighten when the measurement does not fit. The choice is
then timed beside a shortlist of others (:mod:`.shortlist`), where a lossy combination is kept
only if it measures more than :data:`EXACT_PREFERENCE` faster than the fastest exact one (and
DropIT or quantized activations than the fastest with bf16 alone).

Example:
    >>> from .techniques import MicroBatches
    >>> micro = MicroBatches(16, seconds_of=lambda size: 0.1 + size)
    >>> decision = decide(Estimate(200, 1600), [micro], budget_bytes=700,
    ...                   measure=lambda estimate: estimate.peak_bytes + 20)
    >>> decision.chosen.summary, decision.measured_bytes
    ('4 micro-batches of at most 4', 620)
    >>> decision.table().splitlines()[0].split(' | ')[1:]
    ['predicted peak MiB', 'measured peak MiB', 'predicted time', 'measured time', 'chosen |']
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from ..common.units import mib
from ..errors import ConfigError
from .combinations import combinations, fastest_fitting
from .corrections import Corrections
from .decision import Decision
from .estimate import Estimate
from .techniques import Technique

MARGIN = 0.05
"""A combination is chosen only if its predicted peak is at most ``1 - MARGIN`` of the budget,
unless none is: then one predicted within the budget itself is tried (its measurement decides)."""

ATTEMPTS = 3
"""Measured combinations that did not fit before the search gives up."""

EXACT_PREFERENCE = 1.05
"""A less exact combination is kept only if the fastest more exact one measured to fit takes
more than this many times its measured step time: a lossy one against an exact one (which costs
no accuracy), DropIT or quantized activations against bf16 alone
(:func:`~.shortlist.exactness`, :func:`~.shortlist.choose_measured`)."""

NEAR_MEASUREMENTS = 4
"""Combinations predicted over the budget by no more than the bytes they may not hold (their
lossy settings' constant bytes under a checkpoint plan), measured at most for one decision (see
:func:`decide`)."""

LOWER = 'sharding the model state with FSDP over several processes'
"""What goes lower than every technique here, for the error message of a budget none reaches."""


def decide(start: Estimate, techniques: Sequence[Technique], budget_bytes: int,
           measure: Callable[[Estimate], int], lower: str = LOWER,
           correction: float = 1.0) -> Decision:
    """The fastest combination whose predicted peak fits ``budget_bytes`` with
    :data:`MARGIN` (without it when none does) and whose measured peak fits it. When a
    measured peak does not fit, its activations measured some factor above their prediction
    (the state's bytes are known): the predicted activations are taken to be that short (all
    of them after an exact combination's miss, those with the same lossy techniques after a
    lossy one's), and the search runs again.

    Lossy techniques' effects are measured one at a time and multiplied, which can be far off
    for a combination of several (bf16 on micro-batches of one sample, say): when the lossy
    combinations measured over the budget and no corrected one is predicted to fit, the exact
    techniques are searched on their own. (Their times are far off too: the shortlist,
    :func:`~.shortlist.choose_measured`, times the choice beside the fastest exact one.)

    Lossy settings' constant bytes (bf16 autocast's cast copies of the weights) are counted
    whatever the other techniques, but under a checkpoint plan some may not be held (the copies
    DropIT's layers save, some of autocast's; how many, only a measurement tells:
    :attr:`~.estimate.Estimate.freeable_bytes`). So a combination faster than the choice whose
    predicted peak less those bytes fits is measured first, fastest first (at most
    :data:`NEAR_MEASUREMENTS` for a decision), and chosen if it fits.

    Args:
        start: The step without any technique, as measured.
        techniques: The techniques to combine, in the order they are applied.
        budget_bytes: The budget for the whole step's peak.
        measure: Applies a combination and returns its measured peak (it stays applied).
        lower: What would go lower than these techniques, for the error message.
        correction: How many times their prediction activations measured already (every
            prediction's activations are multiplied by it).

    Returns:
        The decision; the chosen combination is applied.

    Raises:
        ConfigError: No combination is predicted to fit (the message gives the least predicted
            peak), or the measured ones did not fit and, corrected by their overshoot, no
            other is predicted to (at most :data:`ATTEMPTS` are measured).
    """
    search = _Search(start, techniques, budget_bytes, measure, lower, correction)
    decision = search.run()
    if decision is None and search.corrections.by_lossy_choices:
        decision = search.exact_alone()
    if decision is None:
        raise search.over_budget()
    return decision


class _Search:
    """One search of :func:`decide`: what it measured and learnt, kept across its attempts.

    Attributes:
        corrections: What the measured misses taught.
        exact: The techniques that are not lossy.
        measured: Measured peaks, by summary, of the combinations predicted to fit.
        near_measured: Measured peaks, by summary, of the combinations measured because they
            could fit without the bytes they may not hold (see :meth:`_near_fit`).
    """

    def __init__(self, start: Estimate, techniques: Sequence[Technique], budget_bytes: int,
                 measure: Callable[[Estimate], int], lower: str, correction: float) -> None:
        self.start, self.techniques, self.budget_bytes = start, techniques, budget_bytes
        self.measure, self.lower = measure, lower
        self.corrections = Corrections(int(budget_bytes * (1 - MARGIN)),
                                       frozenset(t.name for t in techniques if t.lossy),
                                       correction)
        self.exact = [technique for technique in techniques if not technique.lossy]
        self.measured: dict[str, int] = {}
        self.near_measured: dict[str, int] = {}

    def run(self) -> Decision | None:
        """Measure the fastest combination predicted to fit (or one measured near the budget
        that fits, :meth:`_near_fit`), learning from each miss, at most :data:`ATTEMPTS` times.

        Returns:
            The decision (its combination in effect); ``None`` when the measured ones did not
            fit and, corrected by their overshoot, no other is predicted to.

        Raises:
            ConfigError: No combination is predicted to fit before any is measured.
        """
        for _ in range(ATTEMPTS):
            considered, predicted = self._predict_fitting()
            near = self._near_fit(considered, predicted)
            if near is not None:
                chosen, peak = near, self.near_measured[near.summary]
            elif predicted is None and self.measured:
                return None  # no corrected prediction fits
            elif predicted is None:
                raise self._below_reach(considered)
            else:
                chosen, peak = predicted, self.measure(predicted)
                self.measured[predicted.summary] = peak
            if peak <= self.budget_bytes:
                return Decision(self.budget_bytes, chosen, peak, considered,
                                {**self.near_measured, **self.measured})
            self.corrections.learn(chosen, peak)
        return None

    def exact_alone(self) -> Decision | None:
        """The exact techniques searched on their own, with what exact misses taught (lossy
        predictions can be far off together); ``None`` when that search fails too."""
        search = _Search(self.start, self.exact, self.budget_bytes, self.measure, self.lower,
                         self.corrections.overall)
        try:
            decision = search.run()
        except ConfigError:
            return None
        if decision is not None:
            decision.measured = {**self.near_measured, **self.measured, **decision.measured}
        return decision

    def _predict(self, among: Sequence[Technique]) -> tuple[list[Estimate], Estimate | None]:
        """Every combination of ``among`` as corrected so far, and the fastest that fits."""
        considered = combinations(self.start, among, self.corrections.sized_for(self.start),
                                  self.corrections.fits)
        return considered, fastest_fitting(considered, self.corrections.fits)

    def _predict_fitting(self) -> tuple[list[Estimate], Estimate | None]:
        """:meth:`_predict` on every technique; when none fits with the margin, those
        predicted within the budget itself are tried (from then on), and their measurement
        decides."""
        considered, chosen = self._predict(self.techniques)
        if chosen is None and self.corrections.limit < self.budget_bytes:
            self.corrections.limit = self.budget_bytes
            considered, chosen = self._predict(self.techniques)
        return considered, chosen

    def _near_fit(self, considered: Sequence[Estimate],
                  chosen: Estimate | None) -> Estimate | None:
        """The fastest combination faster than ``chosen`` that is predicted over the budget by
        no more than the bytes it may not hold and measures within it, measuring them fastest
        first (each measured peak is kept; at most :data:`NEAR_MEASUREMENTS` in all)."""
        bound = math.inf if chosen is None else chosen.time_ratio
        for estimate in sorted(considered, key=lambda e: (e.time_ratio, e.peak_bytes)):
            if len(self.near_measured) >= NEAR_MEASUREMENTS or estimate.time_ratio >= bound:
                return None
            if (estimate.summary not in {**self.near_measured, **self.measured}
                    and estimate.freeable_bytes > 0
                    and estimate.peak_bytes - estimate.freeable_bytes <= self.budget_bytes):
                self.near_measured[estimate.summary] = self.measure(estimate)
                if self.near_measured[estimate.summary] <= self.budget_bytes:
                    return estimate
        return None

    def _below_reach(self, considered: Sequence[Estimate]) -> ConfigError:
        """The error for a budget no combination is predicted to fit."""
        least = min(considered, key=lambda e: e.peak_bytes)
        return ConfigError(
            f'memory budget {mib(self.budget_bytes)} is below what these techniques reach: '
            f'the least predicted step peak is {mib(least.peak_bytes)} '
            f'({least.summary}; of it, parameters, gradients, optimizer state and what '
            f'every pass holds, which none of them lowers: {mib(least.fixed_bytes)}); '
            f'raise the budget, or go lower with {self.lower}')

    def over_budget(self) -> ConfigError:
        """The error for combinations that measured over the budget, when no other is
        predicted to fit after correcting for that."""
        peaks = ', '.join(f'{summary}: {mib(peak)}' for summary, peak in self.measured.items())
        return ConfigError(
            f'memory budget {mib(self.budget_bytes)}: the combinations predicted to fit '
            f'measured above it ({peaks}) and no other is predicted to fit after correcting '
            f'for that; raise the budget, or go lower with {self.lower}')

