"""Nested checkpoints: same step at two and three levels, and the least-memory plan they give
is below single-level plans and predicted close to the measured peak."""
from __future__ import annotations

import dataclasses

import pytest
import timm
import torch
from torch import nn

from mmdropit import ConfigError
from mmdropit.checkpoint import (CheckpointPlan, ModuleTarget, RunTarget, build_chain,
                                 chain_costs, least_peak, plan_for_chain, record_step,
                                 with_nested)
from tests.checkpoint.test_plan import _assert_predicted_then_same_step, _assert_same_step


def test_resnet_stage_with_checkpointed_blocks_inside_gives_the_same_step():
    torch.manual_seed(0)
    model = timm.create_model('resnet18', num_classes=5, drop_rate=0.2)
    x, y = torch.randn(4, 3, 64, 64), torch.randint(0, 5, (4,))
    plan = CheckpointPlan([
        ModuleTarget('layer2', inner=(ModuleTarget('layer2.0'),
                                      ModuleTarget('layer2.1', selective=True))),
        RunTarget('layer3', 0, 1)])
    _assert_same_step(model, plan, x, y)  # BN statistics once, though recomputed twice


def test_deit_three_levels_with_dropout_gives_the_same_step():
    torch.manual_seed(0)
    model = timm.create_model('deit_tiny_patch16_224', img_size=64, num_classes=5,
                              attn_drop_rate=0.1, proj_drop_rate=0.1, drop_path_rate=0.1)
    x, y = torch.randn(4, 3, 64, 64), torch.randint(0, 5, (4,))
    plan = CheckpointPlan([
        RunTarget('blocks', 0, 3, inner=(
            ModuleTarget('blocks.0'),
            ModuleTarget('blocks.1', inner=(ModuleTarget('blocks.1.attn'),
                                            ModuleTarget('blocks.1.mlp', selective=True))))),
        RunTarget('blocks', 5, 8)])
    lines = str(plan).splitlines()
    assert lines[1:4] == ['  checkpoint blocks[0:4]', '    checkpoint blocks.0',
                          '    checkpoint blocks.1']
    assert lines[4] == '      checkpoint blocks.1.attn' and lines[6] == '  checkpoint blocks[5:9]'
    _assert_same_step(model, plan, x, y)


def test_least_memory_plan_nests_goes_lower_and_is_predicted_close_to_measured():
    torch.manual_seed(0)
    model = timm.create_model('deit_tiny_patch16_224', img_size=64, num_classes=5)
    x, y = torch.randn(8, 3, 64, 64), torch.randint(0, 5, (8,))

    def step():
        return nn.functional.cross_entropy(model(x), y)

    chain = build_chain(record_step(model, step), model)
    plan = plan_for_chain(chain)
    nested = [line for line in str(plan).splitlines() if line.startswith('    checkpoint')]
    assert nested, plan.targets
    single_level_floor = least_peak(chain_costs(chain))
    assert plan.planned.activation_peak < 0.95 * single_level_floor
    _assert_predicted_then_same_step(model, plan, x, y)


def test_single_level_plans_for_compiled_models_never_nest_and_say_so_below_their_floor():
    """``nested=False`` (what CheckpointPlanHook uses under torch.compile) searches single-level
    plans only: its least-memory plan is at the single-level floor, and a budget that only a
    nested plan reaches is an error naming single-level plans."""
    torch.manual_seed(0)
    model = timm.create_model('deit_tiny_patch16_224', img_size=64, num_classes=5)
    x, y = torch.randn(8, 3, 64, 64), torch.randint(0, 5, (8,))
    chain = build_chain(record_step(model, lambda: nn.functional.cross_entropy(model(x), y)),
                        model)
    nested, single = plan_for_chain(chain), plan_for_chain(chain, nested=False)
    assert any(target.inner for target in nested.targets)
    assert single.targets and not any(target.inner for target in single.targets)
    floor = least_peak(chain_costs(chain))
    assert nested.planned.activation_peak < single.planned.activation_peak
    assert single.planned.activation_peak <= floor + floor // 16
    between = (nested.planned.activation_peak + single.planned.activation_peak) // 2
    assert plan_for_chain(chain, between).planned.activation_peak <= between
    with pytest.raises(ConfigError, match='below what any single-level plan reaches'):
        plan_for_chain(chain, between, nested=False)


def test_each_inner_checkpoint_is_charged_its_second_run_in_the_outer_recomputation():
    """A checkpoint nested in another runs its machinery again when the outer one recomputes:
    the record carries that host time, and every nested variant pays it once per inner
    checkpoint on top of the outer and inner recomputations."""
    torch.manual_seed(0)
    net = nn.Sequential(*[nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.GELU())
                                          for _ in range(3)]) for _ in range(3)])
    x = torch.randn(4, 8)
    record = record_step(net, lambda: net(x).sum())
    assert record.nesting_seconds >= 0
    for nesting in (0.0, 1.0):
        chain = build_chain(dataclasses.replace(record, nesting_seconds=nesting), net)
        costs = chain_costs(chain)
        segments, _ = with_nested(chain.segments, costs, chain.record.nesting_seconds)
        nested = [segment for segment in segments if segment.inner]
        assert nested
        plain = {segment.plan_target: segment.seconds for segment in chain.segments}
        for segment in nested:
            outer = plain[dataclasses.replace(segment.plan_target, inner=())]
            assert segment.seconds == pytest.approx(
                outer + sum(inner.seconds + nesting for inner in segment.inner))
