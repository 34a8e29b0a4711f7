"""The solvers against brute force on small random chains."""
from __future__ import annotations

import itertools
import random

import pytest

from mmdropit.checkpoint import ChainCosts, SegmentCost, fits, least_peak, least_time
from mmdropit.checkpoint.solver import least_ogc_cost, ogc_cost


_CUTS = (None, -1, 0, 1)  # what a checkpoint leaves kept, as the additive model tells it apart


def _random_costs(rng: random.Random, n: int) -> ChainCosts:
    keep = [rng.randint(0, 20) for _ in range(n)]
    keep_after_cut = [k + rng.randint(0, 5) for k in keep]
    keep_after = {(i, cut): rng.randint(0, keep_after_cut[i]) for i in range(n) for cut in (0, 1)
                  if rng.random() < 0.7}
    transient = [rng.randint(0, 8) for _ in range(n)]
    spans = {(a, b) for a in range(n - 1) for b in range(a + 1, n) if rng.random() < 0.4}
    segments = []
    for a, b in sorted(spans):
        for _ in range(rng.randint(1, 2)):
            after_cut = rng.randint(0, 9)
            segments.append(SegmentCost(
                a, b, rng.randint(0, 6), after_cut, rng.uniform(0.1, 1.0),
                sum(keep[a:b]) + rng.randint(0, 8), rng.choice(_CUTS),
                {cut: rng.randint(0, after_cut) for cut in (0, 1) if rng.random() < 0.7}))
    return ChainCosts(keep, keep_after_cut, transient, segments, keep_after)


def _disjoint_plans(segments: list[SegmentCost]):
    for size in range(len(segments) + 1):
        for plan in itertools.combinations(segments, size):
            ranges = sorted((s.start, s.stop) for s in plan)
            if all(a[1] <= b[0] for a, b in zip(ranges, ranges[1:])):
                yield list(plan)


@pytest.mark.parametrize('seed', range(40))
def test_least_peak_and_least_time_match_brute_force(seed):
    rng = random.Random(seed)
    costs = _random_costs(rng, rng.randint(2, 7))
    plans = [(costs.peak(plan), sum(s.seconds for s in plan), plan)
             for plan in _disjoint_plans(costs.segments)]
    best_peak = min(peak for peak, _, _ in plans)
    assert least_peak(costs) == best_peak
    assert fits(costs, best_peak) and not fits(costs, best_peak - 1)
    for limit in {best_peak, (best_peak + costs.peak([])) // 2, costs.peak([])}:
        best_time = min(seconds for peak, seconds, _ in plans if peak <= limit)
        found = least_time(costs, limit)
        assert costs.peak(found) <= limit
        assert sum(s.seconds for s in found) == pytest.approx(best_time)
    assert least_time(costs, best_peak - 1) is None


@pytest.mark.parametrize('seed', range(20))
def test_least_ogc_cost_matches_brute_force(seed):
    rng = random.Random(100 + seed)
    costs = _random_costs(rng, rng.randint(2, 7))
    best = min(ogc_cost(costs, plan) for plan in _disjoint_plans(costs.segments))
    assert ogc_cost(costs, least_ogc_cost(costs)) == best
