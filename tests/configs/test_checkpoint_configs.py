"""Every checkpoint-plan config loads, builds its hooks, and is planned on a real model."""
from __future__ import annotations

import pytest
import torch
from mmengine.config import Config
from mmengine.registry import HOOKS, MODELS, DefaultScope

import mmdet.registry  # noqa: F401  (mmdet's scope for the detection configs)
import mmdropit  # noqa: F401
from mmdropit.engine.hooks import CheckpointPlanHook, DropITHook
from tests.conftest import ROOT

CONFIGS = sorted(path for path in (ROOT / 'configs').rglob('*ckpt-plan*.py'))


def test_there_are_checkpoint_configs_for_classification_and_detection():
    assert {path.parent.name for path in CONFIGS} >= {'tiny', 'deit', 'faster-rcnn'}


@pytest.mark.parametrize('path', CONFIGS, ids=[path.stem for path in CONFIGS])
def test_checkpoint_config_builds_its_hooks_in_order(path):
    cfg = Config.fromfile(path)
    hooks = [HOOKS.build(hook) for hook in cfg.custom_hooks]
    plan_hooks = [hook for hook in hooks if isinstance(hook, CheckpointPlanHook)]
    assert len(plan_hooks) == 1
    dropit = [hook for hook in hooks if isinstance(hook, DropITHook)]
    if dropit:  # DropIT converts first, so the plan sees its compact bytes
        assert dropit[0].priority == 'VERY_HIGH' and plan_hooks[0].priority == 'HIGH'


def test_the_tiny_combination_plans_the_dropit_model():
    path = ROOT / 'configs' / 'tiny' / 'vit-tiny_dropit-mink0.9_ckpt-plan_mnist5k.py'
    cfg = Config.fromfile(path)
    with DefaultScope.overwrite_default_scope(cfg.get('default_scope')):
        model = MODELS.build(cfg.model)
    hooks = [HOOKS.build(hook) for hook in cfg.custom_hooks]
    hooks[0].apply(model)
    images = torch.randn(4, 1, 28, 28)
    labels = torch.tensor([1, 2, 3, 4])
    plan = mmdropit.plan_checkpoints(
        model.model, lambda: torch.nn.functional.cross_entropy(model.model(images), labels),
        hooks[1].budget)
    assert plan.targets and plan.planned.activation_peak < plan.baseline.activation_peak
