"""The techniques' own caches and candidates: a checkpoint plan searched once answers every
share it fits; the per-block plan is offered once; plans for a compiled step do not nest."""
from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch
from torch import nn

from mmdropit.checkpoint import (CheckpointPlan, ModuleTarget, build_chain, plan_for_chain,
                                 record_step)
from mmdropit.errors import ConfigError
from mmdropit.planner import checkpoint_plans
from mmdropit.planner.checkpoint_plans import CheckpointPlans
from mmdropit.planner.estimate import Estimate


def test_cached_plans_fit_every_share_a_fresh_search_fits():
    """Shares asked for in any order get a plan within them whenever a search on a fresh
    recording finds one: a share below every plan (answered by the least-memory plan) must
    not hide the plans of the shares just above it."""
    torch.manual_seed(0)
    net = nn.Sequential(*[nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
                          for _ in range(8)], nn.Linear(64, 1))
    x = torch.randn(128, 64)
    record = record_step(net, lambda: net(x).sum())
    plans = CheckpointPlans(lambda: build_chain(record, net), step_seconds=lambda: 1.0,
                            model=net)
    least = plans._plan(0.001).activation_share
    shares = [least * (1 - k / 128) for k in range(1, 4)] + [0.45, 0.3, 0.6, least, 0.34, 0.5]
    fitted = 0
    for share in shares:
        got = plans._plan(share)
        asked = math.floor(share * 256) / 256
        try:
            plan_for_chain(build_chain(record, net), budget=asked)
        except ConfigError:
            continue  # no plan reaches it: the least-memory plan is the answer
        fitted += 1
        assert got.activation_share <= asked + 1e-9, (share, got.activation_share)
    assert fitted >= 4


def test_a_searched_plan_with_the_per_block_checkpoints_is_offered_once_as_per_block(
        monkeypatch):
    """The search may answer with exactly the per-block plan's checkpoints (here in another
    order): it is one candidate, named per-block checkpointing, so that a decision between the
    two is never a tie between one plan and itself."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.Sequential(
        *[nn.Sequential(nn.Linear(32, 32), nn.GELU()) for _ in range(4)]), nn.Linear(32, 1))
    x = torch.randn(64, 16)
    record = record_step(net, lambda: net(x).sum())
    plans = CheckpointPlans(lambda: build_chain(record, net), step_seconds=lambda: 1.0,
                            model=net)
    block = plans.per_block
    searched = replace(block, targets=block.targets[::-1])
    monkeypatch.setattr(checkpoint_plans, 'plan_for_chain', lambda chain, budget, **_: searched)
    offered = [estimate.summary for estimate in plans.candidates(Estimate(100, 900), 600)]
    assert offered[1:] == [f'per-block checkpointing (4 blocks, '
                           f'{block.activation_share:.2f} of the activations)'], offered

    other = replace(block, targets=block.targets[:2])
    monkeypatch.setattr(checkpoint_plans, 'plan_for_chain', lambda chain, budget, **_: other)
    plans._plans[False].clear()
    offered = [estimate.summary for estimate in plans.candidates(Estimate(100, 900), 600)]
    assert [summary.split(' (')[0] for summary in offered[1:]] == \
        ['checkpoint plan', 'per-block checkpointing'], offered


def test_plans_for_a_compiled_step_do_not_nest():
    """With ``nested=False`` (a step trained under ``torch.compile``) even the least-memory
    plan, given to a share no plan reaches, is single-level; on the same chain it nests
    otherwise."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 128), *[nn.Sequential(nn.Linear(128, 128), nn.GELU())
                                              for _ in range(24)], nn.Linear(128, 10))
    x = torch.randn(64, 32)
    chain = build_chain(record_step(net, lambda: net(x).sum()), net)
    nests = []
    for nested in (True, False):
        plans = CheckpointPlans(lambda: chain, step_seconds=lambda: 1.0, model=net,
                                nested=nested)
        planned, = [estimate for estimate in plans.candidates(Estimate(0, 10**9), 1)
                    if estimate.choices]
        nests.append(any(target.inner for target in planned.choices[0].setting.targets))
    assert nests == [True, False]


def test_plans_with_their_inputs_on_the_host_are_offered_at_the_devices_bytes():
    """Where the host may keep checkpoint inputs, the per-block plan is offered a second time
    with its inputs there, and a plan searched so: fewer activations (the cost model's device
    bytes), the same time where the link hides the copies behind a third of the step, more by
    the rest where it does not. A link that carries some of the inputs in a third of the step
    moves the first blocks' only, one that carries none gets no such plan. Plans searched so
    are single-level (the cost model walks inner plans on the device)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 32), nn.Sequential(*[
        nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 32)) for _ in range(6)]),
        nn.Linear(32, 1))
    x = torch.randn(1024, 16)  # block inputs of 128 KiB: copies of less stay on the device
    block_input = 1024 * 32 * 4
    record = record_step(net, lambda: net(x).sum())

    def offered(link: float | None, start: Estimate = Estimate(100, 900),
                budget: int = 300) -> dict[str, Estimate]:
        plans = CheckpointPlans(lambda: build_chain(record, net), step_seconds=lambda: 1.0,
                                model=net, host_link=link, whole_seconds=lambda: 2.0)
        return {e.summary.split(',')[0] + (' host' if 'host' in e.summary else ''): e
                for e in plans.candidates(start, budget)}

    assert all('host' not in summary for summary in offered(None))
    fast = offered(math.inf)
    device, hosted = fast['per-block checkpointing (6 blocks'], \
        fast['per-block checkpointing (6 blocks host']
    plan = hosted.setting('checkpoint-plan')
    assert plan.inputs_on_host and not device.setting('checkpoint-plan').inputs_on_host
    assert hosted.activation_bytes == int(900 * plan.activation_share) < device.activation_bytes
    assert hosted.time_ratio == device.time_ratio
    searched = [e.setting('checkpoint-plan') for summary, e in fast.items()
                if summary.startswith('checkpoint plan') and summary.endswith('host')]
    assert len(searched) == 1 and searched[0].inputs_on_host
    assert not any(target.inner for target in searched[0].targets)

    link = 2.5 * block_input * 3 / 2.0  # 2.5 inputs in a third of the 2-second step
    first = offered(link)['per-block checkpointing (6 blocks host']
    assert first.setting('checkpoint-plan').host_checkpoints == (0, 1)
    assert 'the inputs of 2 of its 6 in host memory' in first.summary
    assert hosted.activation_bytes < first.activation_bytes < device.activation_bytes
    assert all('host' not in summary for summary in offered(block_input))

    big = Estimate(100, 9 * 10**9)  # copies of the whole batch beyond a third of the step
    slow = offered(link, big, 3 * 10**9)['per-block checkpointing (6 blocks host']
    plan = slow.setting('checkpoint-plan')
    moved = big.activation_bytes * plan.planned.host_bytes / plan.baseline.activation_peak
    assert slow.time_ratio == pytest.approx(
        device.time_ratio + (moved / link - 2.0 / 3) / 2.0)
    nested = CheckpointPlans(lambda: build_chain(record, net), step_seconds=lambda: 1.0,
                             model=net, host_link=math.inf, whole_seconds=lambda: 2.0)
    assert any(target.inner for target in nested._least(False).targets)
    assert not any(target.inner for target in nested._least(True).targets)


def test_a_model_without_repeated_blocks_is_offered_no_plan_with_inputs_on_the_host():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(),
                        nn.Linear(64, 1))
    x = torch.randn(64, 16)
    record = record_step(net, lambda: net(x).sum())
    plans = CheckpointPlans(lambda: build_chain(record, net), step_seconds=lambda: 1.0,
                            model=net, host_link=math.inf, whole_seconds=lambda: 2.0)
    offered = [estimate.summary for estimate in plans.candidates(Estimate(100, 900), 600)]
    assert len(offered) == 2 and offered[1].startswith('checkpoint plan'), offered


def test_two_plans_that_read_the_same_are_told_apart():
    """Summaries key a decision's measured peaks and times across its searches: a plan whose
    text another plan had (as many checkpoints, the same share to two decimals) gets a number;
    the same plan offered again keeps its text."""
    plans = CheckpointPlans(lambda: None, step_seconds=lambda: 1.0, model=nn.Linear(2, 2))
    first, other = (CheckpointPlan([ModuleTarget(name)]) for name in ('a', 'b'))
    text = 'checkpoint plan (1 top-level checkpoint, 0.50 of the activations)'
    assert plans._distinct(text, first) == text
    assert plans._distinct(text, other) == f'{text} #2'
    assert plans._distinct(text, CheckpointPlan([ModuleTarget('a')])) == text
    assert plans._distinct(text, other) == f'{text} #2'

