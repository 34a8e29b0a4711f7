"""A test-only hook: each process writes its model's state after training (DDP sync checks)."""
from __future__ import annotations

import os.path as osp

import torch
from mmengine.dist import get_rank
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from mmdropit.engine.runner_model import unwrap


@HOOKS.register_module()
class SaveRankStateHook(Hook):
    """Save the unwrapped model's state_dict as ``{work_dir}/rank{rank}_{when}.pt``, ``when``
    being ``initial`` (before training) and ``final`` (after)."""

    def before_train(self, runner) -> None:
        self._save(runner, 'initial')

    def after_train(self, runner) -> None:
        self._save(runner, 'final')

    @staticmethod
    def _save(runner, when: str) -> None:
        path = osp.join(runner.work_dir, f'rank{get_rank()}_{when}.pt')
        torch.save(unwrap(runner.model).state_dict(), path)
