"""Every config under configs/tiny/ (parity/ included) loads, builds and trains one step on its
real data."""
from __future__ import annotations

import pytest
import torch
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmengine.registry import MODELS, DefaultScope
from mmengine.runner import Runner

import mmdet.registry  # noqa: F401  (mmdet's scope for the detection configs)
import mmdropit  # noqa: F401
from tests.conftest import ROOT

CONFIGS = sorted(path for path in (ROOT / 'configs' / 'tiny').rglob('*.py')
                 if '_base_' not in path.parts)


@pytest.mark.parametrize('path', CONFIGS, ids=[path.stem for path in CONFIGS])
def test_config_trains_one_step(path, digit_coco):
    cfg = Config.fromfile(path)
    for split in ('train_dataloader', 'val_dataloader', 'test_dataloader'):
        dataset = cfg[split].dataset
        dataset.indices = 2
        if dataset.type == 'CocoDataset':
            dataset.data_root = f'{digit_coco}/'
    with DefaultScope.overwrite_default_scope(cfg.get('default_scope')):
        model = MODELS.build(cfg.model)
        model.train()
        optim_wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
        dataloader = Runner.build_dataloader(cfg.train_dataloader)
        losses = model.train_step(next(iter(dataloader)), optim_wrapper)
    assert losses and all(torch.isfinite(value).all() for value in losses.values())
