"""Plan and apply activation checkpoints for an MMEngine training run.

Example config::

    custom_imports = dict(imports=['mmdropit'], allow_failed_imports=False)
    custom_hooks = [
        dict(type='DropITHook', gamma=0.9),             # optional; planned with its bytes
        dict(type='CheckpointPlanHook', budget=0.5),    # or None (least memory), or '4GB'
    ]
"""
from __future__ import annotations

import math
import os.path as osp
from collections.abc import Sequence

import torch
from mmengine.dist import broadcast_object_list, get_rank, is_distributed
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from ...checkpoint import (BUDGET_HELP, DEFAULT_GRANULARITY, CheckpointPlan,
                           plan_checkpoints)
from ...common.budget import parse_budget
from ...errors import ConfigError
from ..runner_model import batch_loss, unwrap

ShapeKey = tuple[int, ...]


def shape_key(inputs: object, bucket: int) -> ShapeKey:
    """Batch size, channels and the spatial sizes rounded up to ``bucket`` of a data batch's
    inputs (a stacked tensor, or a list of images as mmdet loads them).

    Example:
        >>> shape_key([torch.zeros(3, 600, 800), torch.zeros(3, 480, 820)], bucket=128)
        (2, 3, 640, 896)
    """
    if isinstance(inputs, torch.Tensor):
        batch, *shape = inputs.shape
    elif isinstance(inputs, Sequence) and inputs and all(isinstance(t, torch.Tensor)
                                                           for t in inputs):
        batch, shape = len(inputs), [max(sizes) for sizes in zip(*(t.shape for t in inputs))]
    else:
        return ()
    spatial = [bucket * math.ceil(size / bucket) for size in shape[1:]]
    return (batch, *shape[:1], *spatial)


@HOOKS.register_module()
class CheckpointPlanHook(Hook):
    """Record the first training iteration, search a checkpoint plan, and train with it.

    Before the first iteration of each new input-shape bucket (multi-scale detection gives
    several), the hook runs the forward pass of ``train_step`` once on that batch (buffers and
    RNG restored afterwards, no gradient kept), searches the plan for ``budget``, logs it,
    writes it to ``{work_dir}/checkpoint_plan_{shape}.json`` and applies it in place; a known
    bucket reuses its plan. DropIT layers (converted earlier by ``DropITHook``) are planned with
    the bytes they really keep. Under DDP every rank records (collectives such as SyncBN stay
    matched) and rank 0's plan is used by all. Works under Runner and FlexibleRunner.

    A model that cannot be planned (recording fails, no checkpointable module) gets a warning
    saying why and trains without a plan. A budget below what any plan reaches is an error
    that gives the least reachable peak.

    Args:
        budget: ``None`` (least memory), a fraction of the unplanned activation peak such as
            ``0.5``, or a size such as ``'4GB'``.
        granularity: Module calls that save more than ``1 / granularity`` of the step's bytes
            are split into their children.
        bucket: Spatial sizes are rounded up to a multiple of this before comparing shapes.
    """

    priority = 'HIGH'  # after DropITHook (VERY_HIGH): plans the converted model

    def __init__(self, budget: float | int | str | None = None,
                 granularity: int = DEFAULT_GRANULARITY, bucket: int = 128) -> None:
        self.budget = parse_budget(budget, BUDGET_HELP)
        if not isinstance(granularity, int) or granularity < 1:
            raise ConfigError(f'CheckpointPlanHook granularity must be an int >= 1, '
                              f'got {granularity!r}')
        if not isinstance(bucket, int) or bucket < 1:
            raise ConfigError(f'CheckpointPlanHook bucket must be an int >= 1, got {bucket!r}')
        self.granularity = granularity
        self.bucket = bucket
        self.plans: dict[ShapeKey, CheckpointPlan | None] = {}
        self.current: ShapeKey | None = None

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        if not isinstance(data_batch, dict):
            return
        key = shape_key(data_batch.get('inputs'), self.bucket)
        if key == self.current:
            return
        model = unwrap(runner.model)
        previous = self.plans.get(self.current)
        if previous is not None:
            previous.remove(model)  # plans are made, and applied, on the plain model
        if key not in self.plans:
            self.plans[key] = self._plan(runner, model, data_batch, key)
        plan = self.plans[key]
        if plan is not None:
            plan.apply(model)
        self.current = key

    def _plan(self, runner, model: torch.nn.Module, data_batch: dict,
              key: ShapeKey) -> CheckpointPlan | None:
        step = batch_loss(model, data_batch, lambda: runner.optim_wrapper.optim_context(model))
        where = 'x'.join(map(str, key)) or 'any'
        try:
            plan = plan_checkpoints(model, step, self.budget, self.granularity)
        except ConfigError:
            raise
        except Exception as exc:  # noqa: BLE001 - any failure of planning leaves training as is
            plan = None
            runner.logger.warning(
                f'CheckpointPlanHook: the model cannot be planned for inputs {where} '
                f'({type(exc).__name__}: {exc}); training continues without a checkpoint plan.')
        if is_distributed():
            shared = [plan]
            broadcast_object_list(shared, src=0)
            plan = shared[0]
        if plan is None:
            return None
        if not plan.targets:
            runner.logger.warning(f'CheckpointPlanHook: no useful checkpoint for inputs {where}; '
                                  'training continues without one.')
            return None
        runner.logger.info(f'{plan}\n(for inputs {where})')
        if get_rank() == 0:
            plan.save(osp.join(runner.work_dir, f'checkpoint_plan_{where}.json'))
        return plan
