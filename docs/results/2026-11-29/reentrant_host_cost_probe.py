"""Host cost of torch's two checkpoints per block and step (stop 62): non-reentrant (what ours
and timm's use) against reentrant, on the 24 tiny blocks of checkpoint_host_cost_probe.py (one
thread, compute negligible; median over 20 alternated rounds of each variant's fastest of 5
steps, over the plain step).

Run: .venv/bin/python docs/results/2026-11-29/reentrant_host_cost_probe.py
"""
import sys, time, statistics, torch
sys.path.insert(0, __file__.rsplit('/', 1)[0])
torch.set_num_threads(1)
from checkpoint_host_cost_probe import _tiny_blocks
from torch import nn
from torch.utils.checkpoint import checkpoint
class W(nn.Module):
    def __init__(s, b, re): super().__init__(); s.b, s.re = b, re
    def forward(s, x): return checkpoint(s.b, x, use_reentrant=s.re)
def make(kind):
    m = _tiny_blocks()
    if kind == 'plain': return m
    return nn.Sequential(*[W(b, kind == 'reentrant') for b in m])
models = {k: make(k) for k in ('plain', 'nonreentrant', 'reentrant')}
x = torch.randn(2, 8, requires_grad=True)
def t(m):
    best = 1e9
    for _ in range(5):
        s = time.perf_counter(); m(x).sum().backward(); best = min(best, time.perf_counter() - s)
    return best
res = {k: [] for k in models}
for r in range(20):
    for k, m in models.items(): res[k].append(t(m))
med = {k: statistics.median(v) for k, v in res.items()}
for k in ('nonreentrant', 'reentrant'):
    print(k, f'{(med[k]-med["plain"])/24*1e6:.0f} us per block and step over plain')


def _calls(model: nn.Module) -> int:
    """Python function calls of 10 steps (cProfile: deterministic)."""
    import cProfile
    import pstats
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(10):
        model(x).sum().backward()
    profile.disable()
    return sum(stat[1] for stat in pstats.Stats(profile).stats.values())


plain_calls = _calls(models['plain'])
for k in ('nonreentrant', 'reentrant'):
    print(k, f'{(_calls(models[k]) - plain_calls) / 240:.0f} Python calls per block and step '
          'over plain')
