"""Configs that use the micro-batching / mixed-precision optim wrappers and FSDP: each loads and
builds its model and optim wrapper; the CPU one trains."""
from __future__ import annotations

import pytest
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmengine.registry import MODEL_WRAPPERS, MODELS, DefaultScope
from mmengine.runner import Runner

import mmdet.registry  # noqa: F401  (mmdet's scope for the detection configs)
import mmdropit  # noqa: F401
from mmdropit.engine.fsdp import FullyShardModelWrapper
from mmdropit.engine.optim import MicroBatchOptimWrapper, MixedPrecisionOptimWrapper
from tests.conftest import ROOT, log_text, two_iteration_cfg

CONFIGS = sorted(path for path in (ROOT / 'configs').rglob('*.py')
                 if any(key in path.stem for key in ('micro', 'budget', 'fsdp')))


def test_every_technique_has_a_config():
    stems = [path.stem for path in CONFIGS]
    for key in ('micro4', 'budget6GB', 'fsdp', 'bf16'):
        assert any(key in stem for stem in stems), key


@pytest.mark.parametrize('path', CONFIGS, ids=[path.stem for path in CONFIGS])
def test_config_builds_its_model_and_optim_wrapper(path):
    cfg = Config.fromfile(path)
    if 'pretrained_file' in cfg.model:
        cfg.model.pretrained_file = None  # the user's local weights file is not here
    with DefaultScope.overwrite_default_scope(cfg.get('default_scope')):
        model = MODELS.build(cfg.model)
        wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
    if 'fsdp' in path.stem:
        assert MODEL_WRAPPERS.get(cfg.model_wrapper_cfg.type) is FullyShardModelWrapper
        assert 'FullyShardCheckpointHook' in [hook['type'] for hook in cfg.custom_hooks]
        return
    assert isinstance(wrapper, MicroBatchOptimWrapper if 'budget' in path.stem
                      else MixedPrecisionOptimWrapper)
    assert wrapper.micro_batching
    assert wrapper.optimizer.defaults['lr'] == cfg.optim_wrapper.optimizer.lr  # base kept


def test_the_tiny_combination_trains_on_cpu(tmp_path):
    path = ROOT / 'configs' / 'tiny' / 'vit-tiny_dropit-mink0.9_ckpt-plan_bf16_micro4_mnist5k.py'
    Runner.from_cfg(two_iteration_cfg(path, tmp_path)).train()
    log = log_text(tmp_path)
    assert 'runs as 4 micro-batch(es) of sizes [8, 8, 8, 8]' in log
    assert 'Checkpoint plan (' in log and 'DropIT on 16 layers' in log
