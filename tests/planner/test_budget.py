"""plan_within_budget on a bare model: for the least peak, each lossy technique is measured at
its leanest setting only (a setting the same technique beats in memory cannot give it)."""
from __future__ import annotations

from dataclasses import replace

import torch
from torch import nn

from mmdropit.planner import StepProbe, plan_within_budget
from mmdropit.planner.budget import dropit_switch


class _Split:
    """What the techniques are applied to: the model and its micro-batch count."""

    def __init__(self, model: nn.Module) -> None:
        self.model, self.micro_batches = model, 1

    def set_micro_batches(self, count: int) -> None:
        self.micro_batches = count


def _probe() -> StepProbe:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 128), *[nn.Sequential(nn.Linear(128, 128), nn.GELU())
                                              for _ in range(4)], nn.Linear(128, 10))
    x, y = torch.randn(512, 32), torch.randint(0, 10, (512,))

    def loss(size: int = 512) -> torch.Tensor:
        return nn.functional.cross_entropy(net(x[:size]), y[:size]) * size / 512

    return StepProbe(net, None, 512, run_part=lambda size: loss(size).backward(),
                     forward_part=loss)


def _recording_switch(probe: StepProbe, applied: list) -> object:
    switch = dropit_switch(probe.model)

    def apply(gamma: float) -> None:
        applied.append(gamma)
        switch.apply(gamma)

    return replace(switch, apply=apply)


def test_the_least_peak_measures_each_lossy_technique_at_its_leanest_setting_only():
    probe, applied = _probe(), []
    outcome = plan_within_budget(probe, None, _Split(probe.model),
                                 [_recording_switch(probe, applied)])
    assert applied and set(applied) == {0.9}
    assert outcome.least and outcome.decision.measured_bytes == outcome.decision.budget_bytes


def test_a_budget_measures_every_setting():
    probe, applied = _probe(), []
    plan_within_budget(probe, 0.9, _Split(probe.model), [_recording_switch(probe, applied)])
    assert {0.5, 0.7, 0.9} <= set(applied)
