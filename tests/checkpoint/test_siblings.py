"""Runs of sibling modules as one checkpoint: a stem written as module attributes called in
``forward`` (torchvision's ResNet), followers in eval mode (MMDetection's frozen BatchNorm), a
passed-on tensor that other code reads (no run offered), and a parent that calls the siblings
otherwise than planned (a clear error)."""
from __future__ import annotations

import copy

import pytest
import torch
import torchvision
from torch import nn

from mmdropit import ConfigError
from mmdropit.checkpoint import (CheckpointPlan, SiblingsTarget, build_chain, checkpoint_siblings,
                                 plan_checkpoints, record_step)
from tests.checkpoint.test_plan import (_all_targets, _assert_predicted_then_same_step,
                                        _assert_same_step)


class _Stem(nn.Module):
    """conv -> bn -> relu -> pool, then a body saving most of the step's bytes, and a head;
    ``reuse`` adds the conv's output to the result, so that output is read outside the stem's
    calls."""

    def __init__(self, reuse: bool = False) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 16, 3, padding=1)
        self.bn = nn.BatchNorm2d(16)
        self.relu = nn.ReLU(inplace=True)
        self.pool = nn.MaxPool2d(2)
        self.body = nn.Sequential(nn.Conv2d(16, 64, 3, padding=1), nn.ReLU(),
                                  *(nn.Sequential(nn.Conv2d(64, 64, 3, padding=1), nn.ReLU())
                                    for _ in range(3)))
        self.head = nn.Linear(64, 5)
        self.reuse = reuse

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        a = self.conv(x)
        h = self.pool(self.relu(self.bn(a)))
        if self.reuse:
            h = h + a[:, :, ::2, ::2]
        return self.head(self.body(h).mean((2, 3)))


def _sibling_runs(model: nn.Module, x: torch.Tensor) -> set[str]:
    chain = build_chain(record_step(model, lambda: model(x).sum()), model, granularity=1000)
    return {s.target.where for s in chain.segments if isinstance(s.target, SiblingsTarget)}


def test_a_resnet_planned_with_sibling_runs_gives_the_same_step_and_predicted_peak():
    torch.manual_seed(0)
    model = torchvision.models.resnet18(num_classes=5)
    x, y = torch.randn(4, 3, 64, 64), torch.randint(0, 5, (4,))

    plan = plan_checkpoints(model, lambda: nn.functional.cross_entropy(model(x), y))
    assert any(isinstance(target, SiblingsTarget) for target in plan.targets), plan
    _assert_predicted_then_same_step(model, plan, x, y)


def test_no_run_passes_on_a_tensor_that_other_code_reads():
    torch.manual_seed(0)
    x = torch.randn(2, 3, 8, 8)
    runs = _sibling_runs(_Stem(), x)
    assert '{conv..pool}' in runs
    assert not any(run.endswith('..body}') for run in runs)  # most of the step's bytes
    runs = _sibling_runs(_Stem(reuse=True), x)
    assert runs and not any(run.startswith('{conv..') for run in runs), runs
    assert '{bn..pool}' in runs  # what bn, relu and pool pass on stays among them


class _Pooled(nn.Module):
    """timm's classifier head: the model's own code takes a token out of the norm's output
    (a view of the same storage) before an identity and a dropout that return what they get."""

    def __init__(self) -> None:
        super().__init__()
        self.mix = nn.Sequential(nn.Linear(8, 256), nn.GELU(), nn.Linear(256, 8))
        self.norm = nn.LayerNorm(8)
        self.fc_norm = nn.Identity()
        self.head_drop = nn.Dropout(0.0)
        self.head = nn.Linear(8, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.norm(self.mix(x))[:, 0]
        return self.head(self.head_drop(self.fc_norm(x)))


def test_a_run_takes_the_tensor_itself_not_a_view_of_the_same_storage():
    torch.manual_seed(0)
    model, x = _Pooled(), torch.randn(4, 5, 8)
    runs = _sibling_runs(model, x)
    assert '{fc_norm..head_drop}' in runs, runs  # the same tensor passed on
    assert not any(run.startswith('{norm..') for run in runs), runs
    plan = plan_checkpoints(model, lambda: model(x).sum())
    _assert_same_step(model, plan, x, torch.randint(0, 3, (4,)))


def test_a_module_with_forward_hooks_only_starts_a_run():
    """An FSDP2 unit gathers its parameters in a forward pre-hook, which a run would skip."""
    torch.manual_seed(0)
    model, x = _Stem(), torch.randn(2, 3, 8, 8)
    assert '{conv..pool}' in _sibling_runs(model, x)
    model.bn.register_forward_pre_hook(lambda module, args: None)
    runs = _sibling_runs(model, x)
    assert '{bn..pool}' in runs and not any(run.startswith('{conv..') for run in runs), runs
    with pytest.raises(ConfigError, match=r'^a sibling checkpoint would run bn without the '
                                          r'forward hooks they have .*plan again'):
        checkpoint_siblings(model, ('conv', 'bn', 'relu'))


def test_later_siblings_in_eval_mode_pass_on_the_run_output():
    """MMDetection's backbones keep BatchNorm in eval mode inside a training model: the first
    sibling decides, and an eval-mode BatchNorm after it is not applied twice."""
    torch.manual_seed(0)
    model, x, y = _Stem(), torch.randn(4, 3, 8, 8), torch.randint(0, 5, (4,))
    model.bn.eval()
    model.bn.running_mean.uniform_()
    _assert_same_step(model, CheckpointPlan([SiblingsTarget('', ('conv', 'bn', 'relu'))]), x, y)
    assert model.bn._mmdropit_siblings.output is None  # released once passed on


def test_eval_mode_and_no_grad_run_every_sibling_plain():
    torch.manual_seed(0)
    model, x = _Stem(), torch.randn(2, 3, 8, 8)
    plain = copy.deepcopy(model).eval()
    checkpoint_siblings(model, ('conv', 'bn', 'relu', 'pool'))
    model.eval()
    torch.testing.assert_close(model(x), plain(x))
    model.train()
    plain.train()
    with torch.no_grad():
        torch.testing.assert_close(model(x), plain(x))


class _Reordered(_Stem):
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.relu(self.conv(x))  # bn skipped: relu is called out of turn
        return self.head(self.body(self.pool(self.bn(h))).mean((2, 3)))


def test_a_sibling_called_otherwise_than_planned_is_a_clear_error():
    model = _Reordered()
    checkpoint_siblings(model, ('conv', 'bn', 'relu'))
    with pytest.raises(RuntimeError, match=r'^checkpoint plan: the siblings conv, bn, relu are '
                                           r'one checkpoint.*relu was called with something '
                                           r'else; plan again'):
        model(torch.randn(2, 3, 8, 8))


def test_a_sibling_run_is_planned_and_removed_like_any_target():
    torch.manual_seed(0)
    model, x = _Stem(), torch.randn(2, 3, 8, 8)
    plan = CheckpointPlan([SiblingsTarget('', ('conv', 'bn', 'relu', 'pool'))])
    plan.apply(model)
    assert {type(m).__name__ for m in (model.conv, model.bn, model.relu, model.pool)} == {
        'CheckpointedConv2d', 'CheckpointedBatchNorm2d', 'CheckpointedReLU',
        'CheckpointedMaxPool2d'}
    plan.remove(model)
    assert [type(m) for m in (model.conv, model.bn, model.relu, model.pool)] == [
        nn.Conv2d, nn.BatchNorm2d, nn.ReLU, nn.MaxPool2d]
    assert not any(hasattr(m, '_mmdropit_siblings') for m in model.modules())
    assert [t.where for t in _all_targets(plan)] == ['{conv..pool}']
