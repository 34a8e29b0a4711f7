"""Exact searches over the additive chain model: least memory, and least time under a budget.

A plan is a set of disjoint checkpointable segments (:class:`~.cost.SegmentCost`). Going through
the chain from the first item, the state at a boundary is the bytes kept so far and what the last
piece left kept (:data:`~.cost.Cut`: no checkpoint, or which one); every later peak only grows
with the bytes kept so far.

- :func:`fits` decides whether some plan keeps the peak within ``limit``: at each boundary only
  the smallest kept total matters, so a dynamic programme over boundaries is exact.
- :func:`least_peak` is the smallest ``limit`` that fits (bisection over bytes).
- :func:`least_time` finds the plan with the least recompute time whose peak is within
  ``limit``: at each boundary it keeps the Pareto front of (bytes kept, seconds) pairs.
- :func:`least_ogc_cost` minimises the objective of Feng & Huang instead (all bytes kept plus
  the largest single piece), for comparison in the benchmark.

This is the chain search of Feng & Huang (CVPR'21, "Optimal Gradient Checkpoint Search for
Arbitrary Computation Graphs") with their objective (checkpoints plus the largest segment)
replaced by the peak of the backward pass, and with time as a second objective. Branches
(residuals, FPN, several heads) live inside module segments, so the search runs over the chain of
module calls rather than over a tensor graph.

Example:
    >>> from .cost import ChainCosts, SegmentCost
    >>> costs = ChainCosts(keep=[4, 4, 4, 4, 1], keep_after_cut=[4, 4, 4, 4, 1],
    ...                    transient=[0] * 5,
    ...                    segments=[SegmentCost(0, 2, 1, 1, 0.2, 8),
    ...                              SegmentCost(2, 4, 1, 1, 0.2, 8),
    ...                              SegmentCost(0, 4, 1, 1, 0.4, 16)])
    >>> costs.peak([]), least_peak(costs)
    (17, 10)
    >>> [(s.start, s.stop) for s in least_time(costs, 10)], least_time(costs, 17)
    ([(0, 2)], [])
"""
from __future__ import annotations

import bisect
import math

from .cost import ChainCosts, Cut, SegmentCost


_Starts = dict[int, list[SegmentCost]]


def _starts(costs: ChainCosts) -> _Starts:
    """The segments by first item."""
    starts: _Starts = {}
    for segment in costs.segments:
        starts.setdefault(segment.start, []).append(segment)
    return starts


def _moves(costs: ChainCosts, starts: _Starts, i: int, before: Cut, kept: int):
    """Each way to go on from boundary ``i`` after a piece that left ``before``: (segment or
    None, the next state as (boundary, what this piece leaves), kept, peak)."""
    keep = costs.item_added(i, before)
    yield None, (i + 1, None), kept + keep, kept + keep + costs.transient[i]
    for segment in starts.get(i, ()):
        inputs = segment.added(before)
        yield (segment, (segment.stop, segment.cut), kept + inputs,
               kept + inputs + segment.recompute)


def fits(costs: ChainCosts, limit: int) -> bool:
    """Whether some plan keeps the activation peak within ``limit`` bytes."""
    starts = _starts(costs)
    n = len(costs.keep)
    best: list[dict[Cut, int]] = [{None: 0}] + [{} for _ in range(n)]  # by boundary
    for i in range(n):
        for before, kept in best[i].items():
            for _, (stop, after), new_kept, peak in _moves(costs, starts, i, before, kept):
                if peak <= limit and new_kept < best[stop].get(after, new_kept + 1):
                    best[stop][after] = new_kept
    return bool(best[n])


def least_peak(costs: ChainCosts) -> int:
    """The smallest activation peak any plan reaches."""
    high = costs.peak([])
    low = max(costs.transient, default=0)
    while low < high:
        middle = (low + high) // 2
        if fits(costs, middle):
            high = middle
        else:
            low = middle + 1
    return high


def least_time(costs: ChainCosts, limit: int) -> list[SegmentCost] | None:
    """The plan with the least recompute time whose peak is within ``limit`` (``None``: none).

    Exact: at each boundary the search keeps every plan that no other plan beats in both bytes
    kept and seconds. Ties in time go to the plan that keeps fewer bytes.
    """
    starts = _starts(costs)
    n = len(costs.keep)
    # front[state]: (kept, seconds, plan) sorted by kept, seconds strictly falling
    # fronts[boundary][cut]: (kept, seconds, plan) sorted by kept, seconds strictly falling
    fronts: list[dict[Cut, list[tuple[int, float, tuple[SegmentCost, ...]]]]] = (
        [{None: [(0, 0.0, ())]}] + [{} for _ in range(n)])
    for i in range(n):
        for before, front in fronts[i].items():
            for kept, seconds, plan in front:
                for segment, (stop, after), new_kept, peak in _moves(costs, starts, i, before,
                                                                     kept):
                    if peak > limit:
                        continue
                    new_seconds = seconds + (segment.seconds if segment else 0.0)
                    new_plan = plan + (segment,) if segment else plan
                    _add_to_front(fronts[stop].setdefault(after, []), new_kept, new_seconds,
                                  new_plan)
        fronts[i] = {}
    finals = [entry for front in fronts[n].values() for entry in front]
    if not finals:
        return None
    return list(min(finals, key=lambda entry: (entry[1], entry[0]))[2])


def _add_to_front(front: list, kept: int, seconds: float, plan: tuple) -> None:
    """Insert ``(kept, seconds, plan)`` unless an entry keeping no more bytes is as fast; drop
    the entries it beats. ``front`` stays sorted by bytes kept with strictly falling seconds,
    so both checks look at neighbours of a binary-search position only (its bytes kept differ
    from entry to entry: the tuples compare as their bytes kept, and ``inf`` seconds put the
    position after an entry keeping as many)."""
    position = bisect.bisect_right(front, (kept, math.inf))
    if position and front[position - 1][1] <= seconds:
        return
    start = position - 1 if position and front[position - 1][0] == kept else position
    stop = position
    while stop < len(front) and front[stop][1] >= seconds:
        stop += 1
    front[start:stop] = [(kept, seconds, plan)]


def ogc_cost(costs: ChainCosts, plan: list[SegmentCost]) -> int:
    """Feng & Huang's objective for a plan: bytes kept in all plus the largest piece (the
    recompute buffer of a segment, or the transient of an item that is not checkpointed)."""
    pieces = list(costs.pieces(plan))
    return sum(added for _, added, _ in pieces) + max((local for _, _, local in pieces), default=0)


def least_ogc_cost(costs: ChainCosts) -> list[SegmentCost]:
    """The plan with the least :func:`ogc_cost` (exact: for each candidate largest piece, the
    plan keeping the fewest bytes with no larger piece)."""
    starts = _starts(costs)
    pieces = sorted({*costs.transient, *(s.recompute for s in costs.segments)})
    best: tuple[int, list[SegmentCost]] | None = None
    n = len(costs.keep)
    for largest in pieces:
        fewest: list[dict[Cut, tuple[int, tuple[SegmentCost, ...]]]] = (
            [{None: (0, ())}] + [{} for _ in range(n)])  # by boundary
        for i in range(n):
            for before, (kept, plan) in fewest[i].items():
                for segment, (stop, after), new_kept, _ in _moves(costs, starts, i, before, kept):
                    piece = segment.recompute if segment else costs.transient[i]
                    if piece <= largest and new_kept < fewest[stop].get(after, (new_kept + 1,))[0]:
                        fewest[stop][after] = (new_kept, plan + (segment,) if segment else plan)
        finals = list(fewest[n].values())
        if finals:
            kept, plan = min(finals, key=lambda entry: entry[0])
            if best is None or kept + largest < best[0]:
                best = (kept + largest, list(plan))
    return best[1] if best else []
