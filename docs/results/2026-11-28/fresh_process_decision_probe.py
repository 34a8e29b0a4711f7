"""A memory-budget decision in a fresh process, as ``MemoryBudgetHook`` makes it on a run's
first iteration: no pass of the model ran before (``tools/benchmark.py`` runs the plain step
first, so its decisions start warm). Prints the planner's passes as they end and the decision.

    python docs/results/2026-11-28/fresh_process_decision_probe.py resnet50 64 0.5
"""
import sys
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[3]
sys.path[:0] = [str(ROOT), str(ROOT / 'docs/results/2026-11-27')]

from decision_phases_probe import seconds, timed  # noqa: E402  (its timed wrapper)
from mmdropit.bench.models import MODELS  # noqa: E402
from mmdropit.bench.techniques import memory_budget  # noqa: E402
from mmdropit.planner import budget, measurements, trials  # noqa: E402

timed(measurements.Measurements, 'unplanned_peak', 'plain step metered')
timed(measurements.Measurements, 'seconds_of', 'pass of a size timed')
timed(trials.Trials, 'peak', 'combination metered')
timed(trials.Trials, 'seconds', 'combination timed')
timed(budget, 'choose_measured', 'shortlist (with what it measures)')

name, batch_size, fraction = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
torch.manual_seed(0)
work = MODELS[name](name, batch_size, torch.device('cpu'))
work.optimizer = torch.optim.SGD(work.model.parameters(), lr=1e-4, momentum=0.9)
started = time.perf_counter()
with memory_budget(fraction)(work):
    took = time.perf_counter() - started
outcome = next(iter(work.budget_outcomes.values()))
print(f'{name} b{batch_size} budget {fraction}: decided in {outcome.seconds:.1f} s '
      f'({took:.1f} s with the printout)')
for label, total in seconds.items():
    print(f'{label}: {total:.1f} s')
