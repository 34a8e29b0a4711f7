"""A test-only hook: each process writes its model's state after training (DDP sync checks)."""
from __future__ import annotations

import os.path as osp

import torch
from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.registry import HOOKS


@HOOKS.register_module()
class SaveRankStateHook(Hook):
    """Save ``{work_dir}/rank{rank}_state.pt`` (the unwrapped model's state_dict) after training."""

    def after_train(self, runner) -> None:
        model = runner.model.module if hasattr(runner.model, 'module') else runner.model
        torch.save(model.state_dict(), osp.join(runner.work_dir, f'rank{get_rank()}_state.pt'))
