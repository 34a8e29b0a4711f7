"""The combination with the least measured peak, when there is no budget (:func:`decide_least`):
among those that take at most a given multiple of the plain step's time, the few predicted
lowest are measured (and timed, so that the bound holds on measured time), and the fastest of
the lowest measured is taken.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from .combinations import combinations
from .decision import Decision
from .estimate import Estimate
from .search import ATTEMPTS
from .techniques import Technique

LEAST_TOLERANCE = 0.01
"""For the least peak, measured peaks within this share of the lowest count as equal: the
fastest of them is taken (as measured where timed), an exact one before a lossy one (a lossy
technique that saves a few tenths of a percent more costs accuracy, and often time, for
nothing)."""
LEAST_MAX_SLOWDOWN = 2.0
"""For the least peak, the most a combination may take, as a multiple of the plain step's
time (measured where the planner times the combinations, else predicted): without a bound, a
batch cut into one-sample micro-batches under the least-memory checkpoint plan reaches the
lowest peak at tens or hundreds of times the step's time (MemoryBudgetHook's
``max_slowdown``; ``None`` lifts the bound)."""
LEAST_ROUNDS = 2
"""For the least peak with a bound on measured time, the rounds of :data:`~.search.ATTEMPTS`
combinations measured and timed before the fastest measured is taken: predictions for
micro-batches and checkpoints on a GPU were found up to 1.7x short of the measured time (a
host-bound step), so the lowest predicted within the bound can all measure above it."""


def decide_least(start: Estimate, techniques: Sequence[Technique],
                 measure: Callable[[Estimate], int],
                 max_slowdown: float | None = LEAST_MAX_SLOWDOWN,
                 seconds: Callable[[Estimate], float] | None = None) -> Decision:
    """The combination with the least measured peak among those that take at most
    ``max_slowdown`` times the plain step's time: of those predicted within the bound, the
    :data:`~.search.ATTEMPTS` predicted lowest (each technique at its least-memory setting
    where it has one, e.g. the least-memory checkpoint plan) are measured, and the lowest
    measured is chosen; peaks within :data:`LEAST_TOLERANCE` of it count as equal: the fastest
    of those, an exact one before a lossy one. Its measured peak becomes the decision's budget.

    With ``seconds``, the bound is on measured time: each measured combination is also timed
    once, and one that measures over the bound is not chosen. Where none of them is within it,
    the predictions were short by at least the least factor they measured above their
    prediction: the lowest of the combinations still within the bound with their predicted
    times scaled by it are measured and timed (:data:`LEAST_ROUNDS` rounds at most), and where
    none measures within the bound, the fastest measured is taken.

    Args:
        start: The step without any technique, as measured.
        techniques: The techniques to combine, in the order they are applied.
        measure: Applies a combination and returns its measured peak (it stays applied).
        max_slowdown: The most time, as a multiple of the plain step's (at least 1: the plain
            step itself is always allowed), or ``None`` for no bound.
        seconds: Applies a combination and returns its measured step time as a multiple of the
            plain step's (``None``: the bound is on predicted times alone).

    Returns:
        The decision (the last combination measured is in effect, not necessarily the chosen
        one: put it in effect with :func:`~.combinations.put_in_effect`); its table shows
        every measured time.

    Example:
        >>> from .techniques import MicroBatches
        >>> micro = MicroBatches(16, seconds_of=lambda size: 0.1 + size)
        >>> decision = decide_least(Estimate(200, 1600), [micro], lambda e: e.peak_bytes + 20)
        >>> decision.chosen.summary, decision.budget_bytes
        ('16 micro-batches of at most 1', 320)
    """
    considered = [estimate for estimate in combinations(start, techniques, budget_bytes=0)
                  if max_slowdown is None or estimate.time_ratio <= max_slowdown]
    measured: dict[str, int] = {}
    timed: dict[str, float] = {}
    timing = seconds is not None and max_slowdown is not None
    shortfall = 1.0  # how many times its prediction a combination at least takes
    candidates: list[Estimate] = []
    for _ in range(LEAST_ROUNDS if timing else 1):
        lowest = sorted((e for e in considered if e.summary not in measured and (
            max_slowdown is None or e.time_ratio * shortfall <= max_slowdown)),
            key=lambda e: (e.peak_bytes, e.time_ratio))[:ATTEMPTS]
        if not lowest:
            break
        measured.update((e.summary, measure(e)) for e in lowest)
        candidates += lowest
        if not timing:
            break
        # one above the plain step's peak (out of memory, say) is not run again to be timed
        timed.update((e.summary, seconds(e)) for e in lowest
                     if measured[e.summary] <= start.peak_bytes)
        if any(timed.get(e.summary, math.inf) <= max_slowdown for e in lowest):
            break
        shortfall = min((timed[e.summary] / e.time_ratio for e in lowest if e.summary in timed),
                        default=shortfall)
    within = [e for e in candidates
              if not timing or timed.get(e.summary, math.inf) <= max_slowdown]
    if not within:  # nothing measured within the bound: the fastest measured
        within = [min(candidates, key=lambda e: (timed.get(e.summary, math.inf),
                                                 measured[e.summary]))]
    floor = min(measured[e.summary] for e in within)
    lossy = {technique.name for technique in techniques if technique.lossy}
    chosen = min((e for e in within if measured[e.summary] <= floor * (1 + LEAST_TOLERANCE)),
                 key=lambda e: (any(c.technique in lossy for c in e.choices),
                                timed.get(e.summary, e.time_ratio)))
    return Decision(measured[chosen.summary], chosen, measured[chosen.summary], considered,
                    measured, timed)
