"""Memory techniques applied to a :class:`~.workload.Workload` and undone afterwards.

Each function here returns (or is) a context-manager factory ``prepare(workload)`` for a
:class:`~.variants.Variant`: entering it applies the technique to the workload's model, leaving
it undoes it. What a technique searches (a checkpoint plan, a micro-batch split) is searched once
per workload, outside the timer, and kept on the workload.

Example:
    >>> from torch import nn
    >>> from .workload import Workload
    >>> net = nn.Sequential(*[nn.Sequential(nn.Linear(8, 8), nn.GELU()) for _ in range(9)])
    >>> work = Workload('mlp', net, lambda: net(torch.randn(4, 8)).sum(), lambda on: None)
    >>> with uniform_sqrt(work):
    ...     print(type(net).__name__)
    CheckpointedSequential
    >>> type(net).__name__
    'Sequential'
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import ContextManager

import torch

from ..checkpoint import (CheckpointPlan, ModuleTarget, RunTarget, build_chain,
                          forward_link_bytes, per_block_plan, plan_checkpoints, record_step)
from ..common.blocks import block_sequences
from ..common.parameters import model_device
from ..codecs import CompressionConfig, RebuiltActivationsConfig, rebuildable_activations
from ..codecs.graph_codes import int8_graph_hooks
from ..dropit import DropITConfig
from ..kernels.switch import eager_only
from ..errors import ConfigError
from ..microbatch import MicroBatchConfig, SplitDecision, search_split
from ..offload import OffloadConfig, host_link
from ..precision import MixedPrecisionConfig
from ..planner import (PART_SAMPLES, StepProbe, bf16_switch, dropit_switch, offload_switch,
                       plan_within_budget, put_in_effect, quantize_switch, quantize_unavailable,
                       rebuilt_switch, remove_all)
from .workload import Workload

Prepare = Callable[[Workload], ContextManager[None]]
"""Applies a technique to a workload on entry and undoes it on exit."""

DROPIT_GAMMA = 0.9
"""Gamma of the DropIT variants (default exclusions: first layer and classifier / predictors)."""


@contextlib.contextmanager
def grad_checkpointing(work: Workload) -> Iterator[None]:
    """The model library's own checkpointing switch (timm's, mmdet's ``with_cp``)."""
    work.set_grad_checkpointing(True)
    try:
        yield
    finally:
        work.set_grad_checkpointing(False)


def stacked(*prepares: Prepare | None) -> Prepare:
    """The preparations given (``None`` skipped), entered in order, left in reverse."""
    @contextlib.contextmanager
    def prepare(work: Workload) -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            for each in prepares:
                if each is not None:
                    stack.enter_context(each(work))
            yield
    return prepare


@contextlib.contextmanager
def compiled_forward(work: Workload) -> Iterator[None]:
    """The model's forward compiled (``torch.compile``, inductor's default mode), compiled once
    per workload (:meth:`Workload.compile`'s way: the loss closures call the model); the
    forward before it is put back on exit. Dynamo guards on autocast and on the model's
    checkpointing switch: a variant that changes them compiles again."""
    model = work.model
    before = model.__dict__.get('forward')  # an instance attribute, e.g. an earlier compile
    if work.compiled_forward is None:
        work.compiled_forward = torch.compile(model.forward)
    model.forward = work.compiled_forward
    try:
        yield
    finally:
        if before is None:
            del model.forward
        else:
            model.forward = before


BF16 = MixedPrecisionConfig('bfloat16', where='bf16 autocast')
"""bfloat16 autocast (no loss scaling)."""
FP16 = MixedPrecisionConfig('float16', where='fp16 autocast')
"""float16 autocast (the benchmark's steps do not scale the loss)."""


def _autocast(work: Workload, precision: MixedPrecisionConfig | None) -> ContextManager[None]:
    if precision is None:
        return contextlib.nullcontext()
    return precision.autocast(model_device(work.model).type)


def bf16_autocast(work: Workload) -> ContextManager[None]:
    """bfloat16 autocast on the model's device (entered around the forward pass)."""
    return _autocast(work, BF16)


def graph_int8(work: Workload) -> ContextManager[None]:
    """int8 codes inside the compiled graphs (``GraphInt8Hook``'s saved-tensor hooks), entered
    around the forward pass (the compiled forward's first call traces them in)."""
    return int8_graph_hooks()


def fp16_autocast(work: Workload) -> ContextManager[None]:
    """float16 autocast on the model's device (entered around the forward pass). The step
    does not scale the loss: a loss scaler adds one multiplication per loss and one unscaling
    of the gradients per step, and no saved tensor."""
    return _autocast(work, FP16)


def decided_autocast(work: Workload) -> ContextManager[None]:
    """The workload's ``switched_precision`` when a budget decision set it."""
    return _autocast(work, work.switched_precision)


def dropit(strategy: str, lean_activations: bool = True, value_bits: int | None = None,
           fused: bool = True) -> Prepare:
    """DropIT at :data:`DROPIT_GAMMA` with ``strategy`` (and kept values in ``value_bits``);
    without ``fused``, on its eager path even where the fused CPU kernels are built."""
    config = DropITConfig(DROPIT_GAMMA, strategy, lean_activations=lean_activations,
                          value_bits=value_bits)

    @contextlib.contextmanager
    def prepare(work: Workload) -> Iterator[None]:
        with config.apply(work.model), contextlib.nullcontext() if fused else eager_only():
            yield
    return prepare


def compressed_activations(with_dropit: bool, bits: int = 8, lean: bool = False) -> Prepare:
    """What norms, GELUs and attentions save, in ``bits`` bits (:class:`CompressionConfig`;
    with ``lean``, GELUs save 4-bit derivative codes); with ``with_dropit``, also DropIT at
    :data:`DROPIT_GAMMA` with its kept values in ``bits`` bits."""
    values = DropITConfig(DROPIT_GAMMA, 'mink', value_bits=bits) if with_dropit else None
    compression = CompressionConfig(bits, lean_activations=lean)

    @contextlib.contextmanager
    def prepare(work: Workload) -> Iterator[None]:
        with values.apply(work.model) if values else contextlib.nullcontext(), \
                compression.apply(work.model):
            yield
    return prepare


def rebuilt_activations(work: Workload) -> contextlib.AbstractContextManager:
    """Activation outputs rebuilt in backward instead of kept by the layer after them
    (:class:`RebuiltActivationsConfig`; exact)."""
    return RebuiltActivationsConfig().apply(work.model)


def plan_key(budget: float | None, objective: str = 'peak', inner_name: str = '',
             inputs_on_host: bool = False) -> str:
    """Where :func:`checkpoint_plan` keeps its plan in ``Workload.plans``."""
    return f'{budget}-{inner_name}-{objective}{"-host" if inputs_on_host else ""}'


def checkpoint_plan(budget: float | None, objective: str = 'peak', inner: Prepare | None = None,
                    inner_name: str = '', inputs_on_host: bool = False) -> Prepare:
    """The planner's plan for ``budget`` (``None``: least memory), searched once per workload
    on the model as ``inner`` (named ``inner_name``) prepares it, and printed;
    ``inputs_on_host``: searched with the checkpoints' inputs in host memory, on a GPU (a CPU
    keeps them where they are, and the plan is searched so), the copies' statistics printed."""
    @contextlib.contextmanager
    def prepare(work: Workload) -> Iterator[None]:
        on_host = inputs_on_host and model_device(work.model).type == 'cuda'
        key = plan_key(budget, objective, inner_name, inputs_on_host)
        with inner(work) if inner else contextlib.nullcontext():
            if key not in work.plans:
                try:
                    work.plans[key] = plan_checkpoints(
                        work.model, work.loss, budget, objective=objective,
                        inputs_on_host=on_host,
                        host_link=host_link(model_device(work.model)) if on_host else None)
                except ConfigError as error:  # a budget below the least reachable peak
                    raise RuntimeError(str(error)) from error
                print(f'  {work.name}: {work.plans[key]}'.replace('\n', '\n  '), flush=True)
            with _in_effect(work, work.plans[key]):
                yield
    return prepare


@contextlib.contextmanager
def _in_effect(work: Workload, plan: CheckpointPlan) -> Iterator[None]:
    """``plan`` applied to the workload's model; the statistics of the copies to host memory
    printed afterwards, where it keeps its inputs there."""
    with plan.apply(work.model) as applied:
        yield
    if applied.host is not None:
        print(f'  {work.name}: {applied.host.stats}', flush=True)


def per_block_checkpoints(inputs_on_host: bool = False) -> Prepare:
    """Our per-block plan (:func:`~mmdropit.checkpoint.per_block_plan`: every block of the
    model's block sequences that runs with gradients, as timm's ``set_grad_checkpointing()``),
    made once per workload and printed; ``inputs_on_host``: the blocks' inputs kept in host
    memory, in forward order as far as the link carries them while the forward pass runs and
    where a copy frees memory (on a GPU; a CPU keeps them where they are)."""
    @contextlib.contextmanager
    def prepare(work: Workload) -> Iterator[None]:
        key = f'per-block-{inputs_on_host}'
        if key not in work.plans:
            chain = build_chain(record_step(work.model, work.loss), work.model)
            plan = per_block_plan(chain, work.model)
            if plan is None:
                raise RuntimeError('no repeated blocks to checkpoint one by one')
            hosted = (plan.with_inputs_on_host(  # (single-level: its blocks are segments)
                chain, forward_link_bytes(chain, host_link(model_device(work.model))))
                if inputs_on_host else plan)
            if hosted is None:
                print(f'  {work.name}: the link carries no block input in the forward pass: '
                      'the per-block plan keeps them on the device', flush=True)
            plan = hosted or plan
            work.plans[key] = plan
            print(f'  {work.name}: {plan}'.replace('\n', '\n  '), flush=True)
        with _in_effect(work, work.plans[key]):
            yield
    return prepare


def offload(share: float, method: str = 'prefetch') -> Prepare:
    """Activation offload (:mod:`mmdropit.offload`) of the earliest blocks of the model's block
    sequences that hold ``share`` of the step's saved bytes, chosen once per workload."""
    config = OffloadConfig(share=share, method=method)

    @contextlib.contextmanager
    def prepare(work: Workload) -> Iterator[None]:
        if share not in work.offloaded:
            work.offloaded[share] = config.choose(work.model, work.loss).names
            print(f'  {work.name}: offload {share} of the saved bytes: '
                  f'{", ".join(work.offloaded[share])}', flush=True)
        with OffloadConfig(work.offloaded[share], method=method).apply(work.model):
            yield
    return prepare


@contextlib.contextmanager
def mmengine_checkpointing(work: Workload) -> Iterator[None]:
    """MMEngine's own ``activation_checkpointing`` (reentrant checkpoint per listed module),
    listing every block of every block sequence."""
    from mmengine.runner.activation_checkpointing import turn_on_activation_checkpointing

    names = [f'{name}.{index}' if name else str(index)
             for name, sequence in block_sequences(work.model) for index in range(len(sequence))]
    if not names:
        raise RuntimeError('no nn.Sequential of blocks to list')
    turn_on_activation_checkpointing(work.model, names)
    modules = dict(work.model.named_modules())
    try:
        yield
    finally:
        for name in names:
            del modules[name].forward  # the instance attribute MMEngine set


@contextlib.contextmanager
def uniform_sqrt(work: Workload) -> Iterator[None]:
    """Checkpoints of about sqrt(n) consecutive blocks (n blocks in all), within each block
    sequence."""
    sequences = block_sequences(work.model)
    if not sequences:
        raise RuntimeError('no nn.Sequential of blocks to split')
    length = max(1, round(sum(len(seq) for _, seq in sequences) ** 0.5))
    targets = []
    for name, sequence in sequences:
        for first in range(0, len(sequence), length):
            last = min(first + length, len(sequence)) - 1
            targets.append(RunTarget(name, first, last) if first < last
                           else ModuleTarget(f'{name}.{first}' if name else str(first)))
    with CheckpointPlan(targets=targets).apply(work.model):
        yield


def micro_batches(parts: int | None = None, *, budget: float | None = None,
                  inner: Prepare | None = None) -> Prepare:
    """The batch as ``parts`` micro-batches, or as the fewest whose measured peak fits
    ``budget`` (:func:`~mmdropit.microbatch.search_split`, the search that
    ``MicroBatchOptimWrapper(memory_budget=...)`` runs), inside ``inner``'s preparation."""
    config = MicroBatchConfig(parts, budget, where='the micro-batches variant')
    if not config.enabled:
        raise ValueError('give either parts or budget')

    @contextlib.contextmanager
    def prepare(work: Workload) -> Iterator[None]:
        if parts is not None and parts > work.batch_size:
            raise RuntimeError(f'a batch of {work.batch_size} cannot run as {parts} micro-batches')
        with inner(work) if inner else contextlib.nullcontext():
            if parts is None and budget not in work.split_decisions:
                work.split_decisions[budget] = _search_split(work, budget)
                print(f'  {work.name}: {work.split_decisions[budget]}', flush=True)
            work.micro_batches = parts or work.split_decisions[budget].micro_batches
            try:
                yield
            finally:
                work.micro_batches = 1
    return prepare


def _search_split(work: Workload, budget: float) -> SplitDecision:
    if work.part_loss is None:
        raise RuntimeError(f'{work.name} cannot be split into micro-batches')
    try:
        return search_split(work.batch_size, lambda size: work.part_loss(0, size).backward(),
                            work.model, work.optimizer, budget)
    except ConfigError as error:  # a budget below one sample's peak
        raise RuntimeError(str(error)) from error


def memory_budget(budget: float | None, lossy: bool = False, offload: bool = False,
                  precision: MixedPrecisionConfig | None = None, compiled: bool = False,
                  rebuild: bool = False) -> Prepare:
    """The combination of techniques that ``MemoryBudgetHook`` would choose for ``budget`` (a
    fraction of the measured step peak; ``None``: the least peak), decided once per workload
    (:func:`~mmdropit.planner.plan_within_budget`) and printed; with ``lossy``, what
    ``MemoryBudgetHook(lossy=True)`` tries too: DropIT, quantized activations, bf16 autocast;
    with ``offload``, activation offload and checkpoint plans with their inputs in host
    memory (``MemoryBudgetHook(offload=True)``; a GPU's); with
    ``rebuild``, rebuilt activations (``MemoryBudgetHook(rebuild=True)``); with
    ``precision``, for a model trained under that autocast (the hook under an
    ``AmpOptimWrapper``): measured, decided and run under it (pair with
    :func:`decided_autocast` as the variant's forward; not with ``lossy``, whose bf16 switch
    is an autocast of its own); with ``compiled``, for a model trained under
    ``torch.compile`` (``MemoryBudgetHook`` under ``compile=True``): single-level checkpoint
    plans, decided on eager passes (stack :func:`compiled_forward` after it; the hook's
    decisions made again when the compiled step measures above the budget are not)."""
    if lossy and precision is not None:
        raise ValueError('memory_budget: lossy already tries bf16 autocast; give one of the two')

    @contextlib.contextmanager
    def prepare(work: Workload) -> Iterator[None]:
        key = (f'{"least" if budget is None else budget}-{lossy}' + ('-offload' if offload else '')
               + (f'-{precision.dtype}' if precision else '') + ('-compiled' if compiled else '')
               + ('-rebuilt' if rebuild else ''))
        before, work.switched_precision = work.switched_precision, \
            precision or work.switched_precision
        try:
            with within_budget(work, key):
                yield
        finally:
            work.switched_precision = before

    @contextlib.contextmanager
    def within_budget(work: Workload, key: str) -> Iterator[None]:
        if key not in work.budget_outcomes:
            if work.part_loss is None:
                raise RuntimeError(f'{work.name} cannot be split into micro-batches')

            def run_part(size: int) -> None:
                with decided_autocast(work):
                    loss = work.part_loss(0, size)
                loss.backward()

            def forward_part(size: int) -> torch.Tensor:
                with decided_autocast(work):
                    return work.part_loss(0, size)

            switches = [dropit_switch(work.model),
                        *([] if quantize_unavailable(work.model) else
                          [quantize_switch(work.model)]),
                        bf16_switch(work)] if lossy else []
            if offload:
                switches.append(offload_switch(work.model, lambda: forward_part(
                    min(work.batch_size, PART_SAMPLES))))
            if rebuild:
                if not rebuildable_activations(work.model):  # as the hook leaves it out
                    raise ConfigError(f'{work.name} has no GELU / SiLU / Hardswish / Mish '
                                      'activation to rebuild')
                switches.append(rebuilt_switch(work.model))
            probe = StepProbe(work.model, work.optimizer, work.batch_size, run_part, forward_part)
            try:
                work.budget_outcomes[key] = plan_within_budget(
                    probe, budget, work, switches, nested=not compiled, inputs_on_host=offload)
            except ConfigError as error:  # a budget below what the techniques reach
                raise RuntimeError(str(error)) from error
            print(f'  {work.name}: {work.budget_outcomes[key]}'.replace('\n', '\n  '), flush=True)
        outcome = work.budget_outcomes[key]
        put_in_effect(outcome.decision.chosen, outcome.techniques, work)
        try:
            yield
        finally:
            remove_all(outcome.techniques, work)
    return prepare
