"""Host time rebuilt activations add to a step where compute is negligible: 24 tiny MLP blocks
(Linear 8->32, GELU, Linear 32->8, residual), batch 4, one thread; median over 30 rounds of
the fastest of 5 steps, plain and rebuilt alternated.

    python docs/results/2026-11-28/rebuilt_activations_host_cost.py
"""
import statistics
import time

import torch
from torch import nn

from mmdropit.codecs import RebuiltActivationsConfig

BLOCKS, ROUNDS = 24, 30


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2 = nn.Linear(8, 32), nn.GELU(), nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.fc2(self.act(self.fc1(x)))


def fastest_step(model: nn.Module, x: torch.Tensor) -> float:
    best = float('inf')
    for _ in range(5):
        started = time.perf_counter()
        model(x).sum().backward()
        best = min(best, time.perf_counter() - started)
    return best


torch.set_num_threads(1)
torch.manual_seed(0)
model, x = nn.Sequential(*[Block() for _ in range(BLOCKS)]), torch.randn(4, 8)
config = RebuiltActivationsConfig()
plain, rebuilt = [], []
for _ in range(ROUNDS):
    plain.append(fastest_step(model, x))
    with config.apply(model):
        rebuilt.append(fastest_step(model, x))
extra = (statistics.median(rebuilt) - statistics.median(plain)) / BLOCKS
print(f'plain step {statistics.median(plain) * 1e3:.2f} ms, '
      f'rebuilt {statistics.median(rebuilt) * 1e3:.2f} ms: {extra * 1e6:+.0f} us a block '
      '(one activation rebuilt, two layers converted) a step')
