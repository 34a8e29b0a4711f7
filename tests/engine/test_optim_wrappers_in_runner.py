"""The optim wrappers in real MMEngine runs: bf16 mixed precision with micro-batches, DropIT and a
checkpoint plan on CPU, resume, and resume inside an accumulation window."""
from __future__ import annotations

import pytest
import torch
from mmengine.hooks import Hook
from mmengine.registry import HOOKS
from mmengine.runner import Runner

import mmdropit  # noqa: F401
from tests.conftest import (TINY_VIT, TINY_VIT_DROPIT, assert_ranks_identical, log_text,
                            train_on_two_ranks, two_iteration_cfg)


def test_bf16_micro_batches_with_dropit_and_a_plan_train_and_resume(tmp_path):
    cfg = two_iteration_cfg(TINY_VIT_DROPIT, tmp_path, dict(type='CheckpointPlanHook'))
    cfg.optim_wrapper.type = 'MixedPrecisionOptimWrapper'
    cfg.optim_wrapper.micro_batches = 4
    Runner.from_cfg(cfg).train()
    log = log_text(tmp_path)
    assert 'each batch of 32 samples runs as 4 micro-batch(es) of sizes [8, 8, 8, 8]' in log
    assert 'Checkpoint plan (' in log
    checkpoint = torch.load(tmp_path / 'epoch_1.pth', weights_only=False)
    assert checkpoint['optimizer']['loss_scaler'] == {}  # bf16: no loss scaling

    cfg.train_cfg.max_epochs = 2
    cfg.resume = True
    runner = Runner.from_cfg(cfg)
    runner.train()
    assert runner.iter == 4 and 'resumed epoch: 1, iter: 2' in log_text(tmp_path)


class _Interrupted(Exception):
    pass


@HOOKS.register_module()
class _InterruptAfterFirstEpoch(Hook):
    """Stops training after epoch 1 has been saved, like a killed job."""

    priority = 'LOWEST'  # after CheckpointHook's after_train_epoch

    def after_train_epoch(self, runner) -> None:
        raise _Interrupted


def _three_iteration_cfg(work_dir, *hooks: dict):
    cfg = two_iteration_cfg(TINY_VIT, work_dir, *hooks)
    cfg.train_dataloader.dataset.indices = 96  # 3 iterations of 32 per epoch
    cfg.train_cfg.max_epochs = 2
    cfg.train_cfg.val_interval = 10
    cfg.optim_wrapper.update(type='MicroBatchOptimWrapper', micro_batches=2,
                             accumulative_counts=2)
    return cfg


def test_resume_inside_an_accumulation_window_continues_it_exactly(tmp_path):
    straight = Runner.from_cfg(_three_iteration_cfg(tmp_path / 'straight'))
    straight.train()

    with pytest.raises(_Interrupted):
        Runner.from_cfg(_three_iteration_cfg(tmp_path / 'resumed',
                                             dict(type='_InterruptAfterFirstEpoch'))).train()
    checkpoint = torch.load(tmp_path / 'resumed' / 'epoch_1.pth', weights_only=False)
    assert 'accumulated_gradients' in checkpoint['optimizer']  # iteration 3 of a 2-window
    cfg = _three_iteration_cfg(tmp_path / 'resumed')
    cfg.resume = True
    resumed = Runner.from_cfg(cfg)
    resumed.train()
    log = log_text(tmp_path / 'resumed')
    assert "the accumulation window continues with the checkpoint's gradients (1 of 2" in log
    assert 'the gradient of some iterations is lost' not in log  # MMEngine's, wrong here

    for (name, param), ref in zip(resumed.model.named_parameters(),
                                  straight.model.parameters()):
        torch.testing.assert_close(param, ref, rtol=1e-5, atol=1e-6, msg=name)


def test_micro_batches_under_ddp_with_dropit_and_a_plan_keep_ranks_identical(tmp_path):
    micro_batching = ("optim_wrapper = dict(type='MicroBatchOptimWrapper', micro_batches=2)\n")
    log = train_on_two_ranks(tmp_path, "dict(type='CheckpointPlanHook')", micro_batching)
    assert 'runs as 2 micro-batch(es) of sizes [8, 8]' in log
    assert_ranks_identical(tmp_path)
