"""Typed plan targets: plan files written before them still load and train the same step, the
JSON form round-trips, and a target this version cannot read is a one-line error."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from mmdropit import ConfigError
from mmdropit.checkpoint import (CheckpointPlan, ModuleTarget, RunTarget, SiblingsTarget,
                                 is_checkpointed, targets_from_json, targets_to_json)
from tests.checkpoint.test_plan import _all_targets, _assert_same_step

BEFORE = Path(__file__).parent / 'data' / 'plan_before_typed_targets.json'
"""Written by the code before typed targets (commit 7bcfdd0): ``plan_checkpoints`` on
``_Blocks()`` with ``x = torch.randn(16, 8)`` and ``step = lambda: model(x).square().mean()``,
budget None (seed 0), a nested plan; then ``'selective'`` appended by hand to the entries of
``blocks.2`` (nested) and ``blocks.6`` (top level), since no planned plan of a model this small
had both kinds; saved with ``plan.save``."""

BEFORE_PRINTED = """\
Checkpoint plan (10 checkpoints, budget least memory):
  checkpoint blocks.0
  checkpoint blocks[1:4]
    checkpoint blocks.1
    checkpoint blocks.2 (selective: keeps matmul / conv / attention outputs)
    checkpoint blocks.3[0:2]
  checkpoint blocks[4:6]
    checkpoint blocks.4
    checkpoint blocks.5[0:2]
  checkpoint blocks.6 (selective: keeps matmul / conv / attention outputs)
  checkpoint blocks.7[0:2]
  predicted activation peak 0.0 MiB (0.25 of 0.2 MiB unplanned), recompute 0.005 s per step \
(1.01 of the forward pass); planned in 0.1 s"""
"""``str(CheckpointPlan.load(BEFORE))`` as the code before typed targets printed it."""


class _Blocks(nn.Module):
    """Eight Linear-GELU-Linear-GELU blocks in an ``nn.Sequential`` (the fixture's model)."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(8, 32)
        self.blocks = nn.Sequential(*(
            nn.Sequential(nn.Linear(32, 128), nn.GELU(), nn.Linear(128, 32), nn.GELU())
            for _ in range(8)))
        self.head = nn.Linear(32, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.blocks(self.stem(x)))


def test_a_plan_file_written_before_typed_targets_loads_prints_and_trains_the_same_step():
    plan = CheckpointPlan.load(BEFORE)
    assert plan.targets[1] == RunTarget('blocks', 1, 3, inner=(
        ModuleTarget('blocks.1'), ModuleTarget('blocks.2', selective=True),
        RunTarget('blocks.3', 0, 1)))
    assert plan.targets[3] == ModuleTarget('blocks.6', selective=True)
    assert len(plan.targets) == 5 and len(_all_targets(plan)) == 10
    assert str(plan) == BEFORE_PRINTED
    assert plan.to_json() == json.loads(BEFORE.read_text())  # written back as it was read

    torch.manual_seed(0)
    model, x = _Blocks(), torch.randn(16, 8)
    y = torch.randint(0, 4, (16,))
    _assert_same_step(model, plan, x, y)  # applies the plan, then one step against a copy
    checkpointed = {name for name, module in model.named_modules() if is_checkpointed(module)}
    assert checkpointed == {target.module for target in _all_targets(plan)}


NESTED = [
    ModuleTarget('stem'),
    RunTarget('blocks', 0, 3, inner=(
        ModuleTarget('blocks.0', selective=True),
        ModuleTarget('blocks.1', inner=(ModuleTarget('blocks.1.attn'),
                                        RunTarget('blocks.1.mlp', 0, 2, selective=True))),
        RunTarget('blocks.2', 1, 2))),
    RunTarget('blocks', 4, 5, selective=True),
    ModuleTarget('neck', inner=(ModuleTarget('neck.lateral'), ModuleTarget('neck.fpn'))),
]

SIBLINGS = [
    SiblingsTarget('', ('conv1', 'bn1', 'relu', 'maxpool'), inner=(ModuleTarget('bn1.inner'),)),
    SiblingsTarget('layer1.0', ('conv1', 'bn1'), selective=True),
]


@pytest.mark.parametrize('targets', [
    [],
    [RunTarget('blocks', 0, 2), ModuleTarget('blocks.3')],
    NESTED,
    [RunTarget('', 0, 2, inner=(ModuleTarget('0.fc'), RunTarget('1', 0, 1, selective=True))),
     ModuleTarget('3', selective=True)],  # runs of the model itself, an nn.Sequential
    SIBLINGS,
], ids=['empty', 'single-level', 'nested-selective', 'model-is-sequential', 'siblings'])
def test_typed_targets_round_trip_through_json(targets, tmp_path):
    flat = targets_to_json(targets)
    assert all(isinstance(entry, list) for entry in flat)
    assert targets_from_json(json.loads(json.dumps(flat))) == targets
    plan = CheckpointPlan(targets=targets)
    plan.save(tmp_path / 'plan.json')
    assert CheckpointPlan.load(tmp_path / 'plan.json') == plan


def test_the_json_form_is_the_flat_list_of_before():
    assert targets_to_json(NESTED) == [
        ['module', 'stem'], ['run', 'blocks', 0, 3], ['module', 'blocks.0', 'selective'],
        ['module', 'blocks.1'], ['module', 'blocks.1.attn'],
        ['run', 'blocks.1.mlp', 0, 2, 'selective'], ['run', 'blocks.2', 1, 2],
        ['run', 'blocks', 4, 5, 'selective'], ['module', 'neck'], ['module', 'neck.lateral'],
        ['module', 'neck.fpn']]


def test_sibling_targets_cover_their_siblings_and_print_their_span():
    assert targets_to_json(SIBLINGS) == [
        ['siblings', '', ['conv1', 'bn1', 'relu', 'maxpool']], ['module', 'bn1.inner'],
        ['siblings', 'layer1.0', ['conv1', 'bn1'], 'selective']]
    stem, block = SIBLINGS
    assert (stem.module, stem.where, block.module, block.where) == (
        'conv1', '{conv1..maxpool}', 'layer1.0.conv1', 'layer1.0.{conv1..bn1}')
    assert block.occupies == ('layer1.0.conv1', 'layer1.0.bn1')
    assert [stem.covers(name) for name in ('conv1', 'conv1.weight', 'maxpool', 'layer1')] == [
        False, True, True, False]
    assert ModuleTarget('layer1.0.bn1.x').lies_inside(block)
    assert not ModuleTarget('layer1.0.conv2').lies_inside(block)


def test_a_nested_target_the_model_lacks_is_refused():
    plan = CheckpointPlan([RunTarget('blocks', 0, 2, inner=(ModuleTarget('blocks.9'),))])
    with pytest.raises(ConfigError, match='modules the model does not have: blocks.9; plan '
                                          'again for this model'):
        plan.apply(_Blocks())


@pytest.mark.parametrize('targets', [
    [['layer', 'blocks.0']],
    [['module']],
    [['module', 'blocks.0', 'cached']],
    [['module', 'blocks.0', 'selective', 'selective']],
    [['run', 'blocks', 0]],
    [['run', 'blocks', 0, 2, 'selective', 3]],
    [['run', 'blocks', '0', 2]],
    [['run', 'blocks', 2, 0]],
    [['siblings', '', ['conv1']]],
    [['siblings', '', 'conv1', 'bn1']],
    [['siblings', '', ['conv1', 2]]],
    [{'module': 'blocks.0'}],
    {'module': 'blocks.0'},
], ids=['unknown-kind', 'module-short', 'unknown-mark', 'module-long', 'run-short', 'run-long',
        'run-text-index', 'run-backwards', 'siblings-one', 'siblings-not-a-list',
        'siblings-not-names', 'entry-not-a-list', 'targets-not-a-list'])
def test_a_target_this_version_cannot_read_is_a_one_line_error(targets, tmp_path):
    path = tmp_path / 'plan.json'
    path.write_text(json.dumps({'targets': targets, 'budget': None}))
    with pytest.raises(ConfigError, match='checkpoint plan file is not one this version of '
                                          r'mmdropit reads .*; plan again') as error:
        CheckpointPlan.load(path)
    assert '\n' not in str(error.value)
