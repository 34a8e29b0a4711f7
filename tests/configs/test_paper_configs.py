"""Every full-size config (configs/deit, faster-rcnn, mask-rcnn) loads, builds its model, applies
its DropIT hook, and trains one step: classification on a synthetic batch (CIFAR-100 is not
here), detection through the config's own training pipeline on the real digits-on-canvas set."""
from __future__ import annotations

import pytest
import torch
from mmengine.config import Config
from mmengine.optim import build_optim_wrapper
from mmengine.registry import HOOKS, MODELS, DefaultScope
from mmengine.runner import Runner
from mmengine.structures import BaseDataElement

import mmdet.registry  # noqa: F401  (mmdet's scope for the detection configs)
import mmdropit  # noqa: F401
from mmdropit.dropit import dropit_layers
from tests.conftest import ROOT

CONFIGS = sorted(path for family in ('deit', 'faster-rcnn', 'mask-rcnn')
                 for path in (ROOT / 'configs' / family).glob('*.py'))
DIGITS = ('0', '1', '2', '3', '4', '5', '6', '7', '8', '9')


def test_the_paper_experiments_have_configs():
    stems = {path.stem for path in CONFIGS}
    assert {'deit-s_8xb48_cifar100-ft', 'deit-s_dropit-mink0.9_8xb48_cifar100-ft',
            'deit-b_8xb48_cifar100-ft', 'deit-b_dropit-mink0.9_8xb48_cifar100-ft',
            'faster-rcnn_r50_fpn_26e_coco', 'faster-rcnn_r50_fpn_dropit-mink0.9_26e_coco',
            'mask-rcnn_r50_fpn_26e_coco', 'mask-rcnn_r50_fpn_dropit-mink0.8_26e_coco'} <= stems


def _classification_batch(num_classes: int) -> dict:
    generator = torch.Generator().manual_seed(0)
    return dict(inputs=[torch.randint(0, 256, (3, 224, 224), dtype=torch.uint8,
                                      generator=generator) for _ in range(2)],
                data_samples=[BaseDataElement(gt_label=torch.tensor([label]))
                              for label in (0, num_classes - 1)])


def _detection_batch(cfg: Config, digit_coco) -> dict:
    loader = cfg.train_dataloader
    loader.batch_size = 1
    loader.num_workers = 0
    loader.persistent_workers = False
    loader.dataset.update(data_root=f'{digit_coco}/', metainfo=dict(classes=DIGITS),
                          ann_file='annotations/instances_train.json',
                          data_prefix=dict(img='train/'), indices=1)
    return next(iter(Runner.build_dataloader(loader)))


@pytest.mark.parametrize('path', CONFIGS, ids=[path.stem for path in CONFIGS])
def test_config_trains_one_step(path, digit_coco):
    cfg = Config.fromfile(path)
    if 'pretrained_file' in cfg.model:
        cfg.model.pretrained_file = None  # the user's local weights file is not here
    with DefaultScope.overwrite_default_scope(cfg.get('default_scope')):
        model = MODELS.build(cfg.model).train()
        for hook in cfg.get('custom_hooks', []):
            if hook['type'] == 'DropITHook':
                HOOKS.build(hook).apply(model)
                assert dropit_layers(model)
        if 'num_classes' in cfg.model:
            batch = _classification_batch(cfg.model.num_classes)
        else:
            batch = _detection_batch(cfg, digit_coco)
        optim_wrapper = build_optim_wrapper(model, cfg.optim_wrapper)
        losses = model.train_step(batch, optim_wrapper)
    assert losses and all(torch.isfinite(value).all() for value in losses.values())
