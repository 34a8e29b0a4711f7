"""Plan and apply activation checkpoints for an MMEngine training run.

Example config::

    custom_imports = dict(imports=['mmdropit'], allow_failed_imports=False)
    custom_hooks = [
        dict(type='DropITHook', gamma=0.9),             # optional; planned with its bytes
        dict(type='CheckpointPlanHook', budget=0.5),    # or None (least memory), or '4GB'
    ]
    # on a GPU: dict(type='CheckpointPlanHook', budget=None, inputs_on_host=True)
"""
from __future__ import annotations

import os.path as osp

import torch
from mmengine.dist import broadcast_object_list, get_rank, is_distributed
from mmengine.registry import HOOKS

from ...checkpoint import (BUDGET_HELP, DEFAULT_GRANULARITY, CheckpointPlan,
                           plan_checkpoints)
from ...common.budget import Budget, parse_budget
from ...common.parameters import model_device
from ...common.technique import Applied
from ...common.units import mib
from ...errors import ConfigError
from ...offload import host_link
from ..optim.micro_batching import max_over_ranks
from ..runner_model import batch_loss, compiles_model, unwrap
from .shape_buckets import ShapeBucketHook, ShapeKey, shape_text


def _budget_text(budget: Budget) -> str:
    """A checkpoint plan's budget in words, e.g. ``'budget 0.5 of the unplanned peak'``."""
    if budget is None:
        return 'the least memory'
    if isinstance(budget, float):
        return f'budget {budget} of the unplanned peak'
    return f'budget {mib(budget)}'


@HOOKS.register_module()
class CheckpointPlanHook(ShapeBucketHook):
    """Record the first training iteration, search a checkpoint plan, and train with it.

    Before the first iteration of each new input-shape bucket (multi-scale detection gives
    several), the hook runs the forward pass of ``train_step`` once on that batch (buffers and
    RNG restored afterwards, no gradient kept), searches the plan for ``budget``, logs it,
    writes it to ``{work_dir}/checkpoint_plan_{bucket}.json`` (e.g.
    ``checkpoint_plan_32x1x128x128.json`` for 28x28 images and ``bucket=128``) and applies it
    in place; a known bucket reuses its plan. After the first iteration one line starting
    ``mmdropit: CheckpointPlanHook:`` sums up the plan it trained with. DropIT layers
    (converted earlier by ``DropITHook``) are planned with the bytes they really keep. Under
    DDP every rank records (collectives such as SyncBN stay matched) and rank 0's plan is used
    by all. Works under Runner and FlexibleRunner.

    With ``inputs_on_host`` and a model on a GPU, the plan keeps its checkpoints' inputs in
    pinned host memory, copied off the device as the forward pass goes on and back one
    checkpoint ahead of backward (:attr:`~mmdropit.checkpoint.CheckpointPlan.inputs_on_host`;
    those of its checkpoints in forward order, as far as the host link, measured once, carries
    them while the forward pass runs, where a copy frees device memory), and is searched,
    single-level, on the device bytes that leaves
    (:func:`~mmdropit.checkpoint.plan_checkpoints`): a ViT's residual stream leaves the
    device, so the least memory goes lower. On a CPU, or under ``torch.compile``,
    the inputs stay where they are (a warning says so).

    Under ``torch.compile`` (``compile=True`` in the config) plans are single-level: the
    compiled backward recomputes a checkpoint nested in another together with the outer one, so
    nesting would cost time and keep no less (docs/checkpoint.md, "Under torch.compile").

    A model that cannot be planned (recording fails, no checkpointable module) gets a warning
    saying why and trains without a plan. A budget below what any plan reaches is an error
    that gives the least reachable peak.

    Args:
        budget: ``None`` (least memory), a fraction of the unplanned activation peak such as
            ``0.5``, or a size such as ``'4GB'``.
        granularity: Module calls that save more than ``1 / granularity`` of the step's bytes
            are split into their children.
        bucket: Spatial sizes are rounded up to a multiple of this before comparing shapes.
        inputs_on_host: Keep the checkpoints' inputs in pinned host memory (see above).
    """

    priority = 'HIGH'  # after DropITHook (VERY_HIGH): plans the converted model

    def __init__(self, budget: float | int | str | None = None,
                 granularity: int = DEFAULT_GRANULARITY, bucket: int = 128,
                 inputs_on_host: bool = False) -> None:
        self.budget = parse_budget(budget, BUDGET_HELP)
        if not isinstance(granularity, int) or granularity < 1:
            raise ConfigError(f'CheckpointPlanHook granularity must be an int >= 1, '
                              f'got {granularity!r}')
        if not isinstance(inputs_on_host, bool):
            raise ConfigError(f'CheckpointPlanHook inputs_on_host is True or False, got '
                              f'{inputs_on_host!r}')
        super().__init__(bucket)
        self.granularity = granularity
        self.inputs_on_host = inputs_on_host
        self._applied: Applied | None = None

    @property
    def plans(self) -> dict[ShapeKey, CheckpointPlan | None]:
        """The plan of each input-shape bucket (``None``: trained without one)."""
        return self.decisions

    def decide(self, runner, data_batch: dict, key: ShapeKey) -> CheckpointPlan | None:
        return self._plan(runner, unwrap(runner.model), data_batch, key)

    def enter(self, runner, plan: CheckpointPlan | None) -> None:
        # plans are made, and applied, on the plain model
        self._applied = None if plan is None else plan.apply(unwrap(runner.model))

    def leave(self, runner, plan: CheckpointPlan | None) -> None:
        if self._applied is not None:
            self._applied.remove()

    def decision_summary(self, runner, key: ShapeKey, plan: CheckpointPlan | None) -> str:
        if plan is None:
            return 'trains without a checkpoint plan (the warning above says why)'
        return (f'{self._applied.summary} for {_budget_text(plan.budget)}: predicted '
                f'activation peak {mib(plan.planned.activation_peak)}, '
                f'{plan.activation_share:.2f} of the unplanned '
                f'{mib(plan.baseline.activation_peak)}; written to '
                f'{self._plan_file(runner, key)}')

    @staticmethod
    def _plan_file(runner, key: ShapeKey) -> str:
        """Where the plan of the bucket ``key`` is written (named after the bucket)."""
        return osp.join(runner.work_dir, f'checkpoint_plan_{shape_text(key)}.json')

    def _plan(self, runner, model: torch.nn.Module, data_batch: dict,
              key: ShapeKey) -> CheckpointPlan | None:
        step = batch_loss(model, data_batch, lambda: runner.optim_wrapper.optim_context(model))
        where = self.described[key]
        out_of_memory, refused = False, None
        compiled = compiles_model(runner)
        on_host = self.inputs_on_host and model_device(model).type == 'cuda' and not compiled
        if self.inputs_on_host and not on_host:
            runner.logger.warning(
                'CheckpointPlanHook: inputs_on_host=True keeps the inputs where they are '
                f'{"under torch.compile" if compiled else "on a model that is not on a GPU"}; '
                'the plan is searched with them there.')
        try:
            plan = plan_checkpoints(model, step, self.budget, self.granularity,
                                    nested=not compiled, inputs_on_host=on_host,
                                    host_link=host_link(model_device(model)) if on_host
                                    else None)
        except ConfigError as error:  # raised below, once every process knows
            plan, refused = None, error
        except torch.OutOfMemoryError:  # the step it records is the step training runs
            plan, out_of_memory = None, True
            torch.cuda.empty_cache()
        except Exception as exc:  # noqa: BLE001 - any failure of planning leaves training as is
            plan = None
            runner.logger.warning(
                f'CheckpointPlanHook: the model cannot be planned for {where}: '
                f'{type(exc).__name__}: {exc}; training continues without a checkpoint plan.')
        if max_over_ranks(None if out_of_memory or refused else 0) is None:  # in any process
            if refused is not None:
                raise refused
            if out_of_memory:
                raise ConfigError(
                    f'CheckpointPlanHook: the step ran out of memory while it was recorded for '
                    f'{where}, before any plan could apply: MemoryBudgetHook(budget=...) '
                    'measures a batch that does not fit on a part of it and splits it; or lower '
                    'the batch size')
            raise ConfigError(f'CheckpointPlanHook: another process could not plan {where} '
                              '(its log says why)')
        if is_distributed():
            shared = [plan]
            broadcast_object_list(shared, src=0)
            plan = shared[0]
        if plan is None:
            return None
        if not plan.targets:
            runner.logger.warning(f'CheckpointPlanHook: no useful checkpoint for {where}; '
                                  'training continues without one.')
            return None
        path = self._plan_file(runner, key)
        runner.logger.info(f'{plan}\n(for {where}; written to {path})')
        if get_rank() == 0:
            plan.save(path)
        return plan
