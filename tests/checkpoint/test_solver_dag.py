"""Plans on small branching models (a shared stem feeding two branches, a concatenation, a
residual block, two heads) against every plan of disjoint segments, scored by the exact cost
model: the solvers search an additive form of it, which may count a tensor shared across a
checkpoint boundary more than once, so their least-memory plan may sit above the exact optimum
by up to one such tensor (here at most 15%); budgeted plans always fit the exact budget. On a
DenseNet, whose layers each take every earlier feature map, the additive form of a checkpoint
per layer is the exact one."""
from __future__ import annotations

import random
from collections.abc import Iterator

import pytest
import torch
import torchvision
from torch import nn

from mmdropit.checkpoint import (Chain, Segment, build_chain, chain_costs, plan_for_chain,
                                 predict, record_step)


class _Branchy(nn.Module):
    def __init__(self, rng: random.Random) -> None:
        super().__init__()
        left, right, hidden = (rng.choice([16, 32, 48, 64, 96]) for _ in range(3))
        self.stem = nn.Linear(8, 32)
        self.left = nn.Sequential(nn.Linear(32, left), nn.GELU())
        self.right = nn.Linear(32, right)
        self.fuse = nn.Linear(left + right, 32)
        self.block = nn.Sequential(nn.Linear(32, hidden), nn.GELU(), nn.Linear(hidden, 32))
        self.head_a = nn.Linear(32, 4)
        self.head_b = nn.Linear(32, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = self.stem(x).relu()
        h = self.fuse(torch.cat([self.left(s), self.right(s)], 1))
        h = h + self.block(h)
        return self.head_a(h).square().mean() + self.head_b(h + s).abs().mean()


def _every_plan(chain: Chain, start: int = 0) -> Iterator[list[Segment]]:
    if start >= len(chain.items):
        yield []
        return
    yield from _every_plan(chain, start + 1)
    for segment in chain.segments:
        if segment.start == start:
            for rest in _every_plan(chain, segment.stop):
                yield [segment, *rest]


@pytest.mark.parametrize('seed', range(3))
def test_plans_on_a_branching_model_against_every_plan(seed):
    torch.manual_seed(seed)
    model, x = _Branchy(random.Random(seed)), torch.randn(64, 8)
    chain = build_chain(record_step(model, lambda: model(x)), model, granularity=1000)
    scored = [predict(chain, plan) for plan in _every_plan(chain)]
    assert len(scored) > 10_000
    optimum = min(p.activation_peak for p in scored)
    least = plan_for_chain(chain)
    assert optimum <= least.planned.activation_peak <= 1.15 * optimum
    unplanned = predict(chain, []).activation_peak
    target = (least.planned.activation_peak + unplanned) // 2
    budgeted = plan_for_chain(chain, budget=target)
    assert budgeted.planned.activation_peak <= target


def test_a_checkpoint_per_dense_layer_counts_each_feature_map_once():
    torch.manual_seed(0)
    model = torchvision.models.DenseNet(growth_rate=8, block_config=(6, 6), num_init_features=16,
                                        bn_size=2, num_classes=5)
    x, y = torch.randn(4, 3, 32, 32), torch.randint(0, 5, (4,))
    chain = build_chain(record_step(model, lambda: nn.functional.cross_entropy(model(x), y)),
                        model)
    costs = chain_costs(chain)
    layers = [k for k, segment in enumerate(chain.segments)
              if segment.target.module.rsplit('.', 1)[-1].startswith('denselayer')
              and not segment.selective and not segment.inner]
    assert len(layers) == 12
    exact = predict(chain, [chain.segments[k] for k in layers]).activation_peak
    assert costs.peak([costs.segments[k] for k in layers]) == exact
    assert exact < 0.5 * predict(chain, []).activation_peak
