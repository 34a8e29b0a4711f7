"""Nested checkpoints: a segment whose recomputation is itself checkpointed.

A plain checkpoint keeps its inputs and, in backward, recomputes its whole range at once, so
its recompute buffer is everything the range saves. A *nested* one checkpoints the range and,
inside it, a plan of smaller segments: in backward the range is recomputed keeping only what
the inner plan keeps, and each inner segment is recomputed again when backward reaches it. The
buffer shrinks to the inner plan's peak, for a second recomputation of the inner segments.
One level of nesting, for example a run of four transformer blocks with one checkpoint per
block inside, keeps four times fewer block inputs than per-block checkpoints alone.

:func:`with_nested` adds, for each segment, the variant whose inner plan has the least peak
(the least recompute time among those, each inner checkpoint charged the host time its machinery
costs again in the outer recomputation), when that peak is below the segment's own buffer. Inner
plans may be nested themselves, since shorter segments are handled first. The solvers then weigh
nested variants like any other segment.

Example:
    >>> from .cost import ChainCosts, SegmentCost
    >>> from .chain import Segment
    >>> from .targets import ModuleTarget
    >>> costs = ChainCosts(keep=[4, 4, 4, 1], keep_after_cut=[4, 4, 4, 1], transient=[0] * 4,
    ...                    segments=[SegmentCost(0, 1, 1, 1, 0.1, 4),
    ...                              SegmentCost(0, 3, 1, 1, 0.3, 12)])
    >>> segments = [Segment(0, 1, ModuleTarget('b.a'), (), 0.1),
    ...             Segment(0, 3, ModuleTarget('b'), (), 0.3)]
    >>> segments, costs = with_nested(segments, costs, nesting_seconds=0.05)
    >>> [(s.target.where, [t.target.where for t in s.inner], s.seconds) for s in segments[2:]]
    [('b', ['b.a'], 0.45)]
    >>> costs.segments[2].recompute  # the inner plan's peak, instead of 12
    9
"""
from __future__ import annotations

from dataclasses import replace

from .chain import Segment
from .cost import ChainCosts, SegmentCost
from .solver import fits, least_peak, least_time


def _may_nest(inner: Segment, outer: Segment) -> bool:
    """Whether ``inner`` may be checkpointed inside ``outer``: strictly inside its range, and on
    other modules (one module holds one kind of checkpoint)."""
    return (outer.start <= inner.start and inner.stop <= outer.stop
            and inner.stop - inner.start < outer.stop - outer.start
            and not set(inner.target.occupies) & set(outer.target.occupies))


def _inner_costs(costs: ChainCosts, outer: SegmentCost, inner: list[SegmentCost],
                 nesting_seconds: float) -> ChainCosts:
    """The chain of ``outer``'s items alone, with ``inner`` segments (first item at 0), each
    charged ``nesting_seconds``."""
    span = slice(outer.start, outer.stop)
    return ChainCosts(costs.keep[span], costs.keep_after_cut[span], costs.transient[span],
                      [replace(s, start=s.start - outer.start, stop=s.stop - outer.start,
                               seconds=s.seconds + nesting_seconds) for s in inner],
                      {(i - outer.start, cut): kept for (i, cut), kept in costs.keep_after.items()
                       if outer.start <= i < outer.stop})


def with_nested(segments: list[Segment], costs: ChainCosts,
                nesting_seconds: float = 0.0) -> tuple[list[Segment], ChainCosts]:
    """``segments`` and ``costs`` with the nested variant of each segment that has one.

    Args:
        segments: The chain's segments; ``costs.segments`` are their costs, in the same order.
        costs: The additive model of the chain.
        nesting_seconds: Host time each inner checkpoint adds by running its machinery again
            in the outer recomputation (:func:`~.overhead.nesting_seconds`).

    Returns:
        Both lists extended by the nested variants, in the same order.
    """
    all_segments, all_costs = list(segments), list(costs.segments)
    order = sorted(range(len(segments)), key=lambda k: segments[k].stop - segments[k].start)
    for k in order:
        outer, outer_cost = segments[k], costs.segments[k]
        if outer.selective:
            continue
        inside = [j for j in range(len(all_segments)) if _may_nest(all_segments[j], outer)]
        if not inside:
            continue
        sub = _inner_costs(costs, outer_cost, [all_costs[j] for j in inside], nesting_seconds)
        if not fits(sub, outer_cost.recompute - 1):
            continue
        floor = least_peak(sub)
        chosen = least_time(sub, floor)
        shifted = {id(cost): j for cost, j in zip(sub.segments, inside)}
        inner = tuple(all_segments[shifted[id(cost)]] for cost in chosen)
        seconds = outer.seconds + sum(cost.seconds for cost in chosen)  # charged in sub
        all_segments.append(replace(outer, seconds=seconds, inner=inner))
        all_costs.append(replace(outer_cost, seconds=seconds, recompute=floor))
    return all_segments, replace(costs, segments=all_costs)
