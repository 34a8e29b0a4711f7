"""An mmdet detector under FSDP2 on two gloo CPU processes: the tiny digits Faster R-CNN (stem and
first stage frozen, BatchNorm in eval mode, as mmdet configures it) with DropIT, one shard unit
per ResNet stage; its full checkpoint loads strictly into a plain detector."""
from __future__ import annotations

import re

import torch
from mmengine.config import Config
from mmengine.registry import MODELS, DefaultScope

import mmdet.registry  # noqa: F401  (mmdet's scope)
from tests.conftest import TINY_FRCNN, digit_coco_options, run_dist_train


def test_faster_rcnn_trains_sharded_with_dropit_and_saves_a_plain_checkpoint(tmp_path, digit_coco):
    config = tmp_path / 'config.py'
    config.write_text(
        f"_base_ = r'{TINY_FRCNN}'\n"
        "model_wrapper_cfg = dict(type='FullyShardModelWrapper')\n"
        "custom_hooks = [dict(type='DropITHook', gamma=0.9, strategy='mink'),\n"
        "                dict(type='FullyShardCheckpointHook')]\n")
    work_dir = tmp_path / 'work'
    result = run_dist_train(
        str(config), 2, '--work-dir', str(work_dir), '--cfg-options',
        *digit_coco_options(digit_coco), 'train_cfg.max_epochs=1',
        'train_dataloader.dataset.indices=8', 'default_hooks.logger.interval=1')
    log = result.stdout + result.stderr
    losses = [float(v) for v in re.findall(r'Epoch\(train\).*?\bloss: ([0-9.]+)', log)]
    assert len(losses) == 2 and all(value == value for value in losses)  # 2 iterations, no NaN
    assert 'DropIT on' in log

    checkpoint = torch.load(work_dir / 'epoch_1.pth', weights_only=False)
    cfg = Config.fromfile(TINY_FRCNN)
    with DefaultScope.overwrite_default_scope(cfg.default_scope):
        plain = MODELS.build(cfg.model)
    plain.load_state_dict(checkpoint['state_dict'], strict=True)
    stem = checkpoint['state_dict']['backbone.conv1.weight']
    assert stem.shape == plain.backbone.conv1.weight.shape  # gathered, not a shard
