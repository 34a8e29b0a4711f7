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
from .frontier import FP32
from .techniques import (BF16, bf16_autocast, checkpoint_plan, compiled_forward,
                         compressed_activations, decided_autocast, dropit, fp16_autocast,
                         grad_checkpointing, graph_int8, memory_budget, micro_batches,
                         mmengine_checkpointing, offload, per_block_checkpoints,
                         rebuilt_activations, stacked, uniform_sqrt)
from .workload import Workload

BASELINE = 'baseline'
LOSSY = 'lossy'
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

FRONTIER_COMBINATIONS = tuple(
    (('grad-ckpt+' if checkpointed else '') + f'micro-{parts}' + ('+bf16' if bf16 else ''),
     parts, checkpointed, bf16)
    for checkpointed in (False, True) for parts in (2, 4) for bf16 in (False, True)
    if (checkpointed, parts, bf16) != (False, MICRO_BATCHES, False))
"""The simple recipe's combinations the catalogue lacks otherwise: 2 / 4 micro-batches, with
per-block checkpointing, in fp32 and bf16 (``micro-4`` is there already), as (name,
micro-batches, checkpointed, bf16)."""
FRONTIER_MODELS = ('deit_small', 'resnet50', 'faster_rcnn')
"""The models a frontier run measures unless told otherwise."""
FRONTIER_SIMPLE = (BASELINE, 'grad-ckpt', 'micro-2', 'micro-4', 'grad-ckpt+micro-2',
                   'grad-ckpt+micro-4', 'bf16-autocast', 'grad-ckpt+bf16', 'micro-2+bf16',
                   'micro-4+bf16', 'grad-ckpt+micro-2+bf16', 'grad-ckpt+micro-4+bf16')
"""The frontier's simple baselines on every device: bf16, per-block checkpointing, 2 / 4
micro-batches, and their combinations."""
FRONTIER_OURS = ('ckpt-plan-0.5', 'ckpt-plan-min', *BUDGET_VARIANTS, 'ckpt-plan-0.5+bf16',
                 'ckpt-plan-min+bf16', 'budget-0.5+bf16', 'budget-0.25+bf16',
                 'budget-least+bf16', 'dropit-mink+bf16', 'dropit-mink+grad-ckpt+bf16')
"""Ours on the frontier: plans at 0.5 and least memory, the budget at 0.5 / 0.25 / least, exact
(fp32 and bf16) and lossy, and DropIT 0.9 in bf16, alone and inside the model's own per-block
checkpoints (the simple recipe with DropIT's layers)."""
FRONTIER_GPU = ('compile', 'compile+bf16', 'compile+grad-ckpt+bf16', f'offload-{OFFLOAD_SHARE}',
                f'offload-{OFFLOAD_SHARE}+bf16', f'budget-{OFFLOAD_SHARE}-offload+bf16',
                'budget-0.25-offload+bf16', 'budget-least-offload+bf16', 'ckpt-per-block+bf16',
                'ckpt-per-block-host+bf16', 'ckpt-plan-min-host+bf16')
"""On a GPU only: ``torch.compile`` (simple), activation offload, our per-block plan with the
blocks' inputs in host memory beside the same plan on the device, and the least-memory plan
searched with its inputs in host memory (ours; on a CPU nothing moves)."""


def frontier_run(device_type: str) -> list[str]:
    """The variants of a frontier run on ``device_type`` (``'cpu'``, ``'cuda'``)."""
    return [*FRONTIER_SIMPLE, *FRONTIER_OURS, *(FRONTIER_GPU if device_type == 'cuda' else ())]


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
        precision: What the step computes in, which names its plain step (the frontier's
            reference, :mod:`.frontier`): ``'fp32'``, ``'bf16'`` (bf16 autocast, against
            ``bf16-autocast``), ``'fp16'``, or ``'lossy'`` (a setting that may drop or round what
            it keeps, or switch precision: DropIT, quantized activations, a lossy budget;
            against the fp32 step).
        simple: A recipe anyone can switch on without this plugin (bf16, per-block
            checkpointing, micro-batches, ``torch.compile``): the frontier's baselines.
        compiled: ``prepare`` compiles the model's forward: the harness takes an unmetered
            step first and meters the saved tensors eagerly, as for a compiled run.
    """

    name: str
    prepare: Callable[[Workload], ContextManager[None]] = _nothing
    forward: Callable[[Workload], ContextManager[None]] = _nothing
    precision: str = FP32
    simple: bool = False
    compiled: bool = False


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
                   forward=bf16_autocast if 'bf16' in settings else _nothing,
                   precision=FP32 if not settings else 'bf16' if settings == ['bf16'] else LOSSY,
                   simple=plan is None and not compression)


def _simple(name: str, parts: int = 1, checkpointed: bool = False, bf16: bool = False,
            compiled: bool = False) -> Variant:
    """A simple recipe: ``parts`` micro-batches, per-block checkpointing, bf16 autocast and
    ``torch.compile`` (what anyone can switch on without this plugin)."""
    prepare = grad_checkpointing if checkpointed else None
    if compiled:
        prepare = stacked(prepare, compiled_forward)
    if parts > 1:
        prepare = micro_batches(parts, inner=prepare)
    return Variant(name, prepare=prepare or _nothing, forward=bf16_autocast if bf16 else _nothing,
                   precision='bf16' if bf16 else FP32, simple=True, compiled=compiled)


def catalogue() -> dict[str, Variant]:
    """Every variant by name, in table order."""
    variants = [
        Variant(BASELINE, simple=True),
        _simple('grad-ckpt', checkpointed=True),
        _simple('bf16-autocast', bf16=True),
        Variant('fp16-autocast', forward=fp16_autocast, precision='fp16', simple=True),
        Variant('dropit-mink', prepare=dropit('mink'), precision=LOSSY),
        Variant('dropit-approx', prepare=dropit('mink_approx'), precision=LOSSY),
        Variant('dropit-no-lean', prepare=dropit('mink', lean_activations=False),
                precision=LOSSY),
        Variant('dropit-mink-eager', prepare=dropit('mink', fused=False), precision=LOSSY),
        Variant('dropit-approx-eager', prepare=dropit('mink_approx', fused=False),
                precision=LOSSY),
        Variant('dropit-random', prepare=dropit('random'), precision=LOSSY),
        Variant('dropit-random-eager', prepare=dropit('random', fused=False), precision=LOSSY),
        Variant('dropit-random+bf16', prepare=dropit('random'), forward=bf16_autocast,
                precision=LOSSY),
        Variant('dropit-mink+bf16', prepare=dropit('mink'), forward=bf16_autocast,
                precision=LOSSY),
        Variant('dropit-mink+grad-ckpt+bf16', prepare=stacked(dropit('mink'), grad_checkpointing),
                forward=bf16_autocast, precision=LOSSY),
        Variant('dropit-mink+compile+grad-ckpt+bf16',
                prepare=stacked(dropit('mink'), grad_checkpointing, compiled_forward),
                forward=bf16_autocast, precision=LOSSY, compiled=True),
        Variant('dropit-mink-eager+bf16', prepare=dropit('mink', fused=False),
                forward=bf16_autocast, precision=LOSSY),
        Variant('dropit-int8', prepare=dropit('mink', value_bits=8), precision=LOSSY),
        Variant('int8-acts', prepare=compressed_activations(with_dropit=False), precision=LOSSY),
        Variant('dropit-int8+int8-acts', prepare=compressed_activations(with_dropit=True),
                precision=LOSSY),
        Variant('int8-acts+bf16', prepare=compressed_activations(with_dropit=False),
                forward=bf16_autocast, precision=LOSSY),
        Variant('int8-acts+compile+bf16',
                prepare=stacked(compressed_activations(with_dropit=False), compiled_forward),
                forward=bf16_autocast, precision=LOSSY, compiled=True),
        Variant('graph-int8+compile+bf16', prepare=compiled_forward,
                forward=stacked(bf16_autocast, graph_int8), precision=LOSSY, compiled=True),
        Variant('dropit-int4', prepare=dropit('mink', value_bits=4), precision=LOSSY),
        Variant('int4-acts', prepare=compressed_activations(with_dropit=False, bits=4),
                precision=LOSSY),
        Variant('dropit-int4+int4-acts',
                prepare=compressed_activations(with_dropit=True, bits=4), precision=LOSSY),
        Variant('dropit-int8+int8-acts-lean',
                prepare=compressed_activations(with_dropit=True, lean=True), precision=LOSSY),
        Variant('rebuilt-acts', prepare=rebuilt_activations),
        Variant('rebuilt-acts+bf16', prepare=rebuilt_activations, forward=bf16_autocast,
                precision='bf16'),
        Variant('ckpt-plan-min', prepare=checkpoint_plan(None)),
        Variant('ckpt-plan-0.5', prepare=checkpoint_plan(0.5)),
        _simple('grad-ckpt+bf16', checkpointed=True, bf16=True),
        Variant('ckpt-plan-min+bf16', prepare=checkpoint_plan(None), forward=bf16_autocast,
                precision='bf16'),
        Variant('ckpt-plan-min-host+bf16', prepare=checkpoint_plan(None, inputs_on_host=True),
                forward=bf16_autocast, precision='bf16'),
        Variant('ckpt-plan-0.5+bf16', prepare=checkpoint_plan(0.5), forward=bf16_autocast,
                precision='bf16'),
        Variant('dropit+ckpt-plan-min', prepare=checkpoint_plan(None, inner=dropit('mink'),
                                                                inner_name='dropit'),
                precision=LOSSY),
        Variant('dropit-int8+int8-acts+ckpt-plan-min',
                prepare=checkpoint_plan(None, inner=compressed_activations(True),
                                        inner_name='dropit-int8+int8-acts'), precision=LOSSY),
        Variant('dropit-int8+int8-acts+ckpt-plan-min+micro-2',
                prepare=micro_batches(2, inner=checkpoint_plan(
                    None, inner=compressed_activations(True),
                    inner_name='dropit-int8+int8-acts')), precision=LOSSY),
        Variant(f'offload-{OFFLOAD_SHARE}', prepare=offload(OFFLOAD_SHARE)),
        Variant(f'offload-{OFFLOAD_SHARE}+bf16', prepare=offload(OFFLOAD_SHARE),
                forward=bf16_autocast, precision='bf16'),
        Variant(f'save-on-cpu-{OFFLOAD_SHARE}', prepare=offload(OFFLOAD_SHARE, 'save_on_cpu'),
                simple=True),
        Variant('ckpt-per-block', prepare=per_block_checkpoints()),
        Variant('ckpt-per-block-host', prepare=per_block_checkpoints(inputs_on_host=True)),
        Variant('ckpt-per-block+bf16', prepare=per_block_checkpoints(), forward=bf16_autocast,
                precision='bf16'),
        Variant('ckpt-per-block-host+bf16', prepare=per_block_checkpoints(inputs_on_host=True),
                forward=bf16_autocast, precision='bf16'),
        Variant('ckpt-mmengine', prepare=mmengine_checkpointing, simple=True),
        Variant('ckpt-sqrt', prepare=uniform_sqrt),
        Variant('ckpt-ogc', prepare=checkpoint_plan(None, objective='ogc')),
        *(Variant(f'ckpt-budget-{budget}', prepare=checkpoint_plan(budget))
          for budget in CURVE_BUDGETS),
        _simple(f'micro-{MICRO_BATCHES}', parts=MICRO_BATCHES),
        Variant(f'micro-budget-{MICRO_BUDGET}', prepare=micro_batches(budget=MICRO_BUDGET)),
        Variant(f'dropit+ckpt-plan-min+bf16+micro-{MICRO_BATCHES}',
                prepare=micro_batches(MICRO_BATCHES,
                                      inner=checkpoint_plan(None, inner=dropit('mink'),
                                                            inner_name='dropit')),
                forward=bf16_autocast, precision=LOSSY),
        *(Variant(f'budget-{budget}', prepare=memory_budget(budget)) for budget in BUDGETS),
        Variant('budget-least', prepare=memory_budget(None)),
        *(Variant(f'budget-{budget}-offload', prepare=memory_budget(budget, offload=True))
          for budget in BUDGETS),
        *(Variant(f'budget-{budget or "least"}+bf16',
                  prepare=memory_budget(budget, precision=BF16), forward=decided_autocast,
                  precision='bf16') for budget in (*BUDGETS, None)),
        *(Variant(f'budget-{budget}+compile+bf16',
                  prepare=stacked(memory_budget(budget, precision=BF16, compiled=True),
                                  compiled_forward),
                  forward=decided_autocast, precision='bf16', compiled=True)
          for budget in BUDGETS),
        *(Variant(f'budget-{budget}-rebuilt+bf16',
                  prepare=memory_budget(budget, precision=BF16, rebuild=True),
                  forward=decided_autocast, precision='bf16') for budget in BUDGETS),
        *(Variant(f'budget-{budget or "least"}-offload+bf16',
                  prepare=memory_budget(budget, offload=True, precision=BF16),
                  forward=decided_autocast, precision='bf16') for budget in (*BUDGETS, None)),
        *(Variant(f'budget-{budget}-lossy', prepare=memory_budget(budget, lossy=True),
                  forward=decided_autocast, precision=LOSSY) for budget in BUDGETS),
        Variant('budget-least-lossy', prepare=memory_budget(None, lossy=True),
                forward=decided_autocast, precision=LOSSY),
        *(_grid_point(micro, plan) for micro, plan in GRID_POINTS),
        *(_grid_point(micro, plan, lossy) for lossy, micro, plan in LOSSY_GRID_POINTS),
        *(_simple(name, parts, checkpointed, bf16) for name, parts, checkpointed, bf16 in
          FRONTIER_COMBINATIONS),
        _simple('compile', compiled=True),
        _simple('compile+bf16', bf16=True, compiled=True),
        _simple('compile+grad-ckpt+bf16', checkpointed=True, bf16=True, compiled=True),
    ]
    return {variant.name: variant for variant in variants}
