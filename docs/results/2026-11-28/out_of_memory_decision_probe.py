"""A memory-budget decision for a batch that does not fit: every pass of more than CAPACITY
samples raises ``torch.OutOfMemoryError`` after its forward pass (the CPU has no limit to run
into), so the planner predicts the step with nothing applied from a part. Prints the decision;
the same model's decision on the whole batch is in fresh_process_decision.txt.

    python docs/results/2026-11-28/out_of_memory_decision_probe.py resnet50 64 0.5 40
"""
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[3]))

from mmdropit.bench.models import MODELS  # noqa: E402
from mmdropit.bench.techniques import memory_budget  # noqa: E402

name, batch_size, fraction, capacity = (sys.argv[1], int(sys.argv[2]), float(sys.argv[3]),
                                        int(sys.argv[4]))
torch.manual_seed(0)
work = MODELS[name](name, batch_size, torch.device('cpu'))
work.optimizer = torch.optim.SGD(work.model.parameters(), lr=1e-4, momentum=0.9)
part_loss = work.part_loss


def limited_part_loss(first: int, size: int) -> torch.Tensor:
    loss = part_loss(first, size)
    if size > capacity and torch.is_grad_enabled():
        raise torch.OutOfMemoryError(f'{size} samples do not fit (at most {capacity})')
    return loss


work.part_loss = limited_part_loss
started = time.perf_counter()
with memory_budget(fraction)(work):
    took = time.perf_counter() - started
print(f'{name} b{batch_size} budget {fraction}, at most {capacity} samples a pass: decided in '
      f'{took:.1f} s')
