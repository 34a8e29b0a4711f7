"""How much colder the first whole-batch pass of a fresh process is than later ones, with or
without a small pass before it (is there a cheap warm-up for the memory budget's first,
metered pass?). ``metered``: each pass under the CPU step-peak meter (``trial_peaks``), as the
budget's first pass runs; otherwise timed (``trial_seconds``).

    python docs/results/2026-11-28/cold_first_pass_probe.py resnet50 8 timed
"""
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from mmdropit.bench.models import MODELS  # noqa: E402
from mmdropit.memory import trial_peaks, trial_seconds  # noqa: E402

name, first, how = sys.argv[1], int(sys.argv[2]), sys.argv[3]
torch.manual_seed(0)
work = MODELS[name](name, 64, torch.device('cpu'))
optimizer = torch.optim.SGD(work.model.parameters(), lr=1e-4, momentum=0.9)
for size in [*([first] if first else []), 64, 64, 64][:4 if first else 3]:
    started = time.perf_counter()
    run = (lambda size=size: work.part_loss(0, size).backward())
    if how == 'metered':
        trial_peaks(run, work.model, optimizer)
    else:
        trial_seconds(run, work.model)
    print(f'{name} {how} pass of {size}: {time.perf_counter() - started:.1f} s', flush=True)
