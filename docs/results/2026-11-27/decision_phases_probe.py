"""Where a memory-budget decision's time goes: ``tools/benchmark.py`` run with the planner's
passes timed one by one (the plain step metered and timed, each micro-batch size timed, the
search's and the shortlist's trial passes; each lossy setting's measurement since stop 50),
printed as they end and summed at the end (stop 48). The labels nest: a pass run inside another
labelled call (the plain passes a lossy setting's measurement runs first) counts in both.

    python docs/results/2026-11-27/decision_phases_probe.py --models deit_small \
        --batch-size 64 --steps 1 --variants budget-0.5 --out /tmp/phases
"""
import collections
import functools
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT / 'tools'), str(ROOT)]

import benchmark  # noqa: E402  (tools/benchmark.py)
from mmdropit.planner import budget, measurements, trials  # noqa: E402

seconds: dict[str, float] = collections.defaultdict(float)
calls: collections.Counter = collections.Counter()


def timed(owner, name: str, label: str) -> None:
    """Replace ``owner.name`` by the same callable, timed under ``label``."""
    function = getattr(owner, name)

    @functools.wraps(function)
    def wrapper(*args, **kwargs):
        started = time.perf_counter()
        try:
            return function(*args, **kwargs)
        finally:
            took = time.perf_counter() - started
            seconds[label] += took
            calls[label] += 1
            if took >= 0.05:
                print(f'  [{label}] {took:.1f} s', flush=True)

    setattr(owner, name, wrapper)


if __name__ == '__main__':
    timed(measurements.Measurements, 'unplanned_peak', 'plain step metered')
    timed(measurements.Measurements, 'effect', 'lossy setting measured')
    timed(measurements.Measurements, 'seconds_of', 'pass of a size timed')
    timed(measurements.Measurements, 'peak_of', 'pass of a size metered')
    timed(trials.Trials, 'record_plain_step', 'step recorded for plans')
    timed(trials.Trials, 'peak', 'combination metered')
    timed(trials.Trials, 'seconds', 'combination timed')
    timed(budget, 'decide', 'search (with what it measures)')
    timed(budget, 'choose_measured', 'shortlist (with what it measures)')
    benchmark.main(sys.argv[1:])
    for label, total in seconds.items():
        print(f'{label}: {total:.1f} s in {calls[label]} calls')
