"""The combination with the least measured peak, when there is no budget (:func:`decide_least`):
among those predicted to take at most a given multiple of the plain step's time, the few
predicted lowest are measured, and the fastest of the lowest measured is taken.
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

from .combinations import combinations
from .decision import Decision
from .estimate import Estimate
from .search import ATTEMPTS
from .techniques import Technique

LEAST_TOLERANCE = 0.01
"""For the least peak, measured peaks within this share of the lowest count as equal: the
fastest predicted of them is taken, an exact one before a lossy one (a lossy technique that
saves a few tenths of a percent more costs accuracy, and often time, for nothing)."""
LEAST_MAX_SLOWDOWN = 2.0
"""For the least peak, the most a combination may take, as a multiple of the plain step's
predicted time: without a bound, a batch cut into one-sample micro-batches under the
least-memory checkpoint plan reaches the lowest peak at tens or hundreds of times the step's
time (MemoryBudgetHook's ``max_slowdown``; ``None`` lifts the bound)."""


def decide_least(start: Estimate, techniques: Sequence[Technique],
                 measure: Callable[[Estimate], int],
                 max_slowdown: float | None = LEAST_MAX_SLOWDOWN) -> Decision:
    """The combination with the least measured peak among those predicted to take at most
    ``max_slowdown`` times the plain step's time: the :data:`~.search.ATTEMPTS` of them
    predicted lowest (each technique at its least-memory setting where it has one, e.g. the
    least-memory checkpoint plan) are measured, and the lowest measured is chosen; peaks within
    :data:`LEAST_TOLERANCE` of it count as equal: the fastest predicted of those, an exact one
    before a lossy one. Its measured peak becomes the decision's budget.

    Args:
        start: The step without any technique, as measured.
        techniques: The techniques to combine, in the order they are applied.
        measure: Applies a combination and returns its measured peak (it stays applied).
        max_slowdown: The most predicted time, as a multiple of the plain step's (at least 1:
            the plain step itself is always allowed), or ``None`` for no bound.

    Returns:
        The decision (the last combination measured is in effect, not necessarily the chosen
        one: put it in effect with :func:`~.combinations.put_in_effect`).

    Example:
        >>> from .techniques import MicroBatches
        >>> micro = MicroBatches(16, seconds_of=lambda size: 0.1 + size)
        >>> decision = decide_least(Estimate(200, 1600), [micro], lambda e: e.peak_bytes + 20)
        >>> decision.chosen.summary, decision.budget_bytes
        ('16 micro-batches of at most 1', 320)
    """
    considered = [estimate for estimate in combinations(start, techniques, budget_bytes=0)
                  if max_slowdown is None or estimate.time_ratio <= max_slowdown]
    lowest = sorted(considered, key=lambda e: (e.peak_bytes, e.time_ratio))[:ATTEMPTS]
    measured = {estimate.summary: measure(estimate) for estimate in lowest}
    floor = min(measured.values())
    lossy = {technique.name for technique in techniques if technique.lossy}
    chosen = min((e for e in lowest if measured[e.summary] <= floor * (1 + LEAST_TOLERANCE)),
                 key=lambda e: (any(c.technique in lossy for c in e.choices), e.time_ratio))
    return Decision(measured[chosen.summary], chosen, measured[chosen.summary], considered,
                    measured)
