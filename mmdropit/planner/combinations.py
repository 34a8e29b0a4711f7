"""Combinations of techniques: every combination of their candidates (:func:`combinations`), the
fastest predicted to fit (:func:`fastest_fitting`), and one put in effect on a target
(:func:`put_in_effect`, :func:`remove_all`).

Example:
    >>> from .estimate import Estimate
    >>> from .techniques import MicroBatches
    >>> micro = MicroBatches(4, seconds_of=lambda size: 1.0 + size)
    >>> considered = combinations(Estimate(100, 400), [micro], budget_bytes=300)
    >>> [e.summary for e in considered]
    ['nothing', '2 micro-batches of at most 2', '4 micro-batches of at most 1']
    >>> fastest_fitting(considered, lambda e: e.peak_bytes <= 300).summary
    '2 micro-batches of at most 2'
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from .estimate import Estimate
from .techniques import Target, Technique


def combinations(start: Estimate, techniques: Sequence[Technique], budget_bytes: int,
                 fits: Callable[[Estimate], bool] | None = None) -> list[Estimate]:
    """Every combination of the techniques' candidates, each technique applied on top of the
    ones before it (in the order given).

    With ``fits`` (whether a combination fits the budget), a last technique that never makes a
    step faster (:attr:`~.techniques.Technique.slows_only`, as a checkpoint plan) is offered the
    combinations before it fastest first, and none slower than a fitting combination already
    found (those are listed as they are): nothing it would add could be chosen, and each of its
    candidates may cost a search.
    """
    frontier = [start]
    for index, technique in enumerate(techniques):
        if fits is not None and technique.slows_only and index == len(techniques) - 1:
            return _fastest_first(frontier, technique, budget_bytes, fits)
        frontier = [after for before in frontier
                    for after in technique.candidates(before, budget_bytes)]
    return frontier


def _fastest_first(frontier: Sequence[Estimate], technique: Technique, budget_bytes: int,
                   fits: Callable[[Estimate], bool]) -> list[Estimate]:
    """``technique``'s candidates on each of ``frontier``, fastest first; from the first
    combination slower than a fitting candidate on, the combinations as they are (so that the
    decision table still shows them)."""
    found: list[Estimate] = []
    fastest = math.inf
    for before in sorted(frontier, key=lambda e: (e.time_ratio, e.peak_bytes)):
        if before.time_ratio > fastest:
            found.append(before)
            continue
        for after in technique.candidates(before, budget_bytes):
            found.append(after)
            if fits(after):
                fastest = min(fastest, after.time_ratio)
    return found


def fastest_fitting(considered: Sequence[Estimate],
                    fits: Callable[[Estimate], bool]) -> Estimate | None:
    """The fastest estimate that ``fits`` (the lower peak among equally fast ones); ``None``
    when none does."""
    return min((estimate for estimate in considered if fits(estimate)),
               key=lambda e: (e.time_ratio, e.peak_bytes), default=None)


def remove_all(techniques: Sequence[Technique], target: Target) -> None:
    """Remove every technique from ``target``, the last applied first."""
    for technique in reversed(techniques):
        technique.remove(target)


def put_in_effect(estimate: Estimate, techniques: Sequence[Technique], target: Target) -> None:
    """Remove every technique from ``target``, then apply the settings ``estimate`` chose."""
    remove_all(techniques, target)
    by_name = {technique.name: technique for technique in techniques}
    for choice in estimate.choices:
        by_name[choice.technique].apply(choice.setting, target)
