"""The variants a benchmark compares with the baseline: one memory technique (or a combination)
each, built fresh for every run.

A :class:`Variant` is a name and two context-manager factories: ``prepare`` applies the technique
to a workload around each measured step (outside the timer) and undoes it, ``forward`` is entered
around the forward pass only (autocast). :func:`catalogue` lists them all in table order; the
groups say which a run measures by default, for the checkpoint curve and for micro-batching. A
new technique is one more :class:`Variant` in :func:`catalogue` (its preparation in
:mod:`.techniques`).

Example:
    >>> variants = catalogue()
    >>> list(variants)[:3]
    ['baseline', 'grad-ckpt', 'bf16-autocast']
    >>> set(DEFAULT_VARIANTS) <= set(variants) and BASELINE not in DEFAULT_VARIANTS
    True
    >>> set(CURVE_VARIANTS + MICRO_VARIANTS + BUDGET_VARIANTS) <= set(variants)
    True
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import ContextManager

from .budget_grid import (GRID_POINTS, GRID_VARIANTS, LOSSY_GRID_POINTS, LOSSY_GRID_VARIANTS,
                          grid_name)
from .techniques import (BF16, bf16_autocast, checkpoint_plan, compressed_activations,
                         decided_autocast, dropit, fp16_autocast, grad_checkpointing,
                         memory_budget, micro_batches, mmengine_checkpointing, offload,
                         uniform_sqrt)
from .workload import Workload

BASELINE = 'baseline'
CURVE_BUDGETS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8)
"""Budgets of the planner on the memory-vs-time curve of checkpointing."""
MICRO_BATCHES = 4
MICRO_BUDGET = 0.5
OFFLOAD_SHARE = 0.5
"""Share of the saved bytes the activation-offload variants move to host memory (GPU only:
on CPU nothing moves), ``offload-0.5`` with side-stream copies and prefetch, ``save-on-cpu-0.5``
with PyTorch's ``save_on_cpu`` on the same modules."""

DEFAULT_VARIANTS = ('grad-ckpt', 'bf16-autocast', 'dropit-mink', 'dropit-approx',
                    'dropit-no-lean', 'ckpt-plan-min', 'ckpt-plan-0.5', 'dropit+ckpt-plan-min')
"""What a run measures unless told otherwise (besides the baseline)."""
CURVE_VARIANTS = ('grad-ckpt', 'ckpt-mmengine', 'ckpt-sqrt', 'ckpt-ogc', 'ckpt-plan-min',
                  *(f'ckpt-budget-{budget}' for budget in CURVE_BUDGETS))
"""The memory-vs-time curve of checkpointing: hand-made plans and the planner at budgets."""
MICRO_VARIANTS = (f'micro-{MICRO_BATCHES}', f'micro-budget-{MICRO_BUDGET}',
                  f'dropit+ckpt-plan-min+bf16+micro-{MICRO_BATCHES}')
"""Micro-batching: a fixed number of parts, the fewest under a budget, and every technique."""
BUDGETS = (0.5, 0.25)
"""Budgets (fractions of the measured step peak) of the memory-budget planner."""
BUDGET_VARIANTS = (*(f'budget-{budget}' for budget in BUDGETS), 'budget-least',
                   *(f'budget-{budget}-lossy' for budget in BUDGETS), 'budget-least-lossy')
"""The memory-budget planner (``MemoryBudgetHook``'s decision), exact and lossy, at the budgets
and at the least peak it reaches (``budget=None``)."""


def budget_run(grid: bool = False, lossy_grid: bool = False) -> list[str]:
    """The variants of a memory-budget run: the planner's decisions beside each technique alone,
    and with ``grid`` (``lossy_grid``) the measured grid (and lossy grid) that checks them."""
    return [*BUDGET_VARIANTS, 'ckpt-plan-min', 'ckpt-plan-0.5', *MICRO_VARIANTS[:2],
            'bf16-autocast', 'dropit-mink', *(GRID_VARIANTS if grid or lossy_grid else ()),
            *(LOSSY_GRID_VARIANTS if lossy_grid else ())]


def _nothing(work: Workload) -> ContextManager[None]:
    return contextlib.nullcontext()


@dataclass(frozen=True)
class Variant:
    """A memory technique to compare with the baseline.

    Attributes:
        name: Name in the table and on the command line.
        prepare: ``prepare(workload)`` is entered around each measured step, outside the timer:
            it changes the model (e.g. converts layers) and restores it on exit.
        forward: ``forward(workload)`` is entered around the forward pass only (e.g. autocast).
    """

    name: str
    prepare: Callable[[Workload], ContextManager[None]] = _nothing
    forward: Callable[[Workload], ContextManager[None]] = _nothing


_GRID_COMPRESSION = {'dropit': dropit('mink'), 'int8': compressed_activations(with_dropit=False)}
"""How the lossy grid's settings other than bf16 prepare the model."""


def _grid_point(micro: int, plan: float | str | None, lossy: str | None = None) -> Variant:
    """``micro`` micro-batches under the planner's plan for ``plan`` (``'min'``: least memory,
    ``None``: no plan), with ``lossy``'s settings (``'bf16+dropit'``: bf16 autocast and
    DropIT; the plan is searched on the model they prepare): one point of the budget grid
    (:mod:`.budget_grid`)."""
    settings = [] if lossy is None else lossy.split('+')
    compression = next((name for name in settings if name in _GRID_COMPRESSION), '')
    inner = _GRID_COMPRESSION.get(compression)
    if plan is not None:
        inner = checkpoint_plan(None if plan == 'min' else plan, inner=inner,
                                inner_name=compression)
    return Variant(grid_name(micro, plan, lossy), prepare=micro_batches(micro, inner=inner),
                   forward=bf16_autocast if 'bf16' in settings else _nothing)


def catalogue() -> dict[str, Variant]:
    """Every variant by name, in table order."""
    variants = [
        Variant(BASELINE),
        Variant('grad-ckpt', prepare=grad_checkpointing),
        Variant('bf16-autocast', forward=bf16_autocast),
        Variant('fp16-autocast', forward=fp16_autocast),
        Variant('dropit-mink', prepare=dropit('mink')),
        Variant('dropit-approx', prepare=dropit('mink_approx')),
        Variant('dropit-no-lean', prepare=dropit('mink', lean_activations=False)),
        Variant('dropit-mink-eager', prepare=dropit('mink', fused=False)),
        Variant('dropit-approx-eager', prepare=dropit('mink_approx', fused=False)),
        Variant('dropit-mink+bf16', prepare=dropit('mink'), forward=bf16_autocast),
        Variant('dropit-mink-eager+bf16', prepare=dropit('mink', fused=False),
                forward=bf16_autocast),
        Variant('dropit-int8', prepare=dropit('mink', value_bits=8)),
        Variant('int8-acts', prepare=compressed_activations(with_dropit=False)),
        Variant('dropit-int8+int8-acts', prepare=compressed_activations(with_dropit=True)),
        Variant('dropit-int4', prepare=dropit('mink', value_bits=4)),
        Variant('int4-acts', prepare=compressed_activations(with_dropit=False, bits=4)),
        Variant('dropit-int4+int4-acts',
                prepare=compressed_activations(with_dropit=True, bits=4)),
        Variant('dropit-int8+int8-acts-lean',
                prepare=compressed_activations(with_dropit=True, lean=True)),
        Variant('ckpt-plan-min', prepare=checkpoint_plan(None)),
        Variant('ckpt-plan-0.5', prepare=checkpoint_plan(0.5)),
        Variant('grad-ckpt+bf16', prepare=grad_checkpointing, forward=bf16_autocast),
        Variant('ckpt-plan-min+bf16', prepare=checkpoint_plan(None), forward=bf16_autocast),
        Variant('ckpt-plan-0.5+bf16', prepare=checkpoint_plan(0.5), forward=bf16_autocast),
        Variant('dropit+ckpt-plan-min', prepare=checkpoint_plan(None, inner=dropit('mink'),
                                                                inner_name='dropit')),
        Variant('dropit-int8+int8-acts+ckpt-plan-min',
                prepare=checkpoint_plan(None, inner=compressed_activations(True),
                                        inner_name='dropit-int8+int8-acts')),
        Variant('dropit-int8+int8-acts+ckpt-plan-min+micro-2',
                prepare=micro_batches(2, inner=checkpoint_plan(
                    None, inner=compressed_activations(True),
                    inner_name='dropit-int8+int8-acts'))),
        Variant(f'offload-{OFFLOAD_SHARE}', prepare=offload(OFFLOAD_SHARE)),
        Variant(f'offload-{OFFLOAD_SHARE}+bf16', prepare=offload(OFFLOAD_SHARE),
                forward=bf16_autocast),
        Variant(f'save-on-cpu-{OFFLOAD_SHARE}', prepare=offload(OFFLOAD_SHARE, 'save_on_cpu')),
        Variant('ckpt-mmengine', prepare=mmengine_checkpointing),
        Variant('ckpt-sqrt', prepare=uniform_sqrt),
        Variant('ckpt-ogc', prepare=checkpoint_plan(None, objective='ogc')),
        *(Variant(f'ckpt-budget-{budget}', prepare=checkpoint_plan(budget))
          for budget in CURVE_BUDGETS),
        Variant(f'micro-{MICRO_BATCHES}', prepare=micro_batches(MICRO_BATCHES)),
        Variant(f'micro-budget-{MICRO_BUDGET}', prepare=micro_batches(budget=MICRO_BUDGET)),
        Variant(f'dropit+ckpt-plan-min+bf16+micro-{MICRO_BATCHES}',
                prepare=micro_batches(MICRO_BATCHES,
                                      inner=checkpoint_plan(None, inner=dropit('mink'),
                                                            inner_name='dropit')),
                forward=bf16_autocast),
        *(Variant(f'budget-{budget}', prepare=memory_budget(budget)) for budget in BUDGETS),
        Variant('budget-least', prepare=memory_budget(None)),
        *(Variant(f'budget-{budget}-offload', prepare=memory_budget(budget, offload=True))
          for budget in BUDGETS),
        *(Variant(f'budget-{budget}+bf16', prepare=memory_budget(budget, precision=BF16),
                  forward=decided_autocast) for budget in BUDGETS),
        *(Variant(f'budget-{budget}-offload+bf16',
                  prepare=memory_budget(budget, offload=True, precision=BF16),
                  forward=decided_autocast) for budget in BUDGETS),
        *(Variant(f'budget-{budget}-lossy', prepare=memory_budget(budget, lossy=True),
                  forward=decided_autocast) for budget in BUDGETS),
        Variant('budget-least-lossy', prepare=memory_budget(None, lossy=True),
                forward=decided_autocast),
        *(_grid_point(micro, plan) for micro, plan in GRID_POINTS),
        *(_grid_point(micro, plan, lossy) for lossy, micro, plan in LOSSY_GRID_POINTS),
    ]
    return {variant.name: variant for variant in variants}
