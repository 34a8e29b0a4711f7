"""Train within one memory budget: the hook measures the step, combines the memory techniques,
and proves the fit with a measurement.

Example config::

    custom_imports = dict(imports=['mmdropit'], allow_failed_imports=False)
    custom_hooks = [dict(type='MemoryBudgetHook', budget='11GB')]   # or a fraction, e.g. 0.5
    # the least memory the techniques reach within twice the step's time (predicted):
    #   dict(type='MemoryBudgetHook', budget=None)   # max_slowdown=None: whatever the time
    # lossy techniques too: dict(type='MemoryBudgetHook', budget=0.25, lossy=True)
    #                   or: dict(type='MemoryBudgetHook', budget=0.25, allow=['bf16', 'quantize'])
    # on a GPU, activation offload too (exact): dict(type='MemoryBudgetHook', budget=0.5,
    #                                                offload=True)
    # rebuilt activations too (exact): dict(type='MemoryBudgetHook', budget=0.5, rebuild=True)
    # compile = True works too: decided on eager passes, the compiled step's peak measured
"""
from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from pathlib import Path

import torch
from mmengine.dist import (all_reduce, broadcast_object_list, get_rank, get_world_size,
                          is_distributed)
from mmengine.optim import AmpOptimWrapper, OptimWrapper, OptimWrapperDict
from mmengine.registry import HOOKS
from torch import nn

from ...checkpoint.chain import Chain
from ...checkpoint.per_block import own_checkpointing
from ...codecs import CompressedActivations, compressible_modules, rebuildable_activations
from ...common.budget import parse_budget
from ...common.class_swap import ClassSwap
from ...common.files import atomic_write
from ...common.parameters import is_sharded, model_device
from ...common.units import mib
from ...dropit import dropit_layers
from ...errors import ConfigError
from ...microbatch import MicroBatchConfig
from ...planner import (PART_SAMPLES, BudgetOutcome, StepProbe, bf16_switch, dropit_switch,
                        offload_switch, plan_within_budget, put_in_effect, quantize_switch,
                        quantize_unavailable, rebuilt_switch, remove_all)
from ...planner.least import LEAST_MAX_SLOWDOWN
from ...planner.outcome import least_text
from ...planner.search import LOWER
from ..optim.autocast_switch import AutocastSwitch
from ..optim.batch_split import batch_size_of, first_samples, largest_first
from ..optim.micro_batching import MicroBatching, MicroBatchTrainStep, max_over_ranks
from ..runner_model import batch_loss, compiles_model, unwrap
from .activation_offload_hook import ActivationOffloadHook
from .checkpoint_plan_hook import CheckpointPlanHook
from .compiled_peaks import CompiledPeaks
from .rebuilt_activations_hook import RebuiltActivationsHook
from .shape_buckets import ShapeBucketHook, ShapeKey, shape_text

BUDGET_HELP = ("a MemoryBudgetHook budget is the peak of a whole training step, a size such as "
               "'11GB' or '512MiB', a fraction of the measured unplanned step peak such as 0.5, "
               "or None for the least peak the techniques reach")
LOSSY = ('bf16', 'dropit', 'quantize')
"""Techniques that change the computed gradients, tried only with ``lossy`` or ``allow``."""
COMPILED_CORRECTIONS = 2
"""How many times a bucket's decision is made again when its compiled step measures above the
budget (then it is trained with, and warned about)."""

_WRAPPER_SWAP = ClassSwap()


class _RunnerTarget:
    """What the techniques are applied to in a run: the unwrapped model and the optim wrapper
    that splits batches."""

    def __init__(self, model: nn.Module, wrapper: MicroBatching) -> None:
        self.model = model
        self.wrapper = wrapper

    def set_micro_batches(self, count: int) -> None:
        self.wrapper.micro_batch_config = MicroBatchConfig(count)


def _prepared(wrapper: OptimWrapper, autocast: bool) -> MicroBatching:
    """``wrapper``, made able to split batches (and, with ``autocast``, to switch bfloat16
    autocast): its class gains the mixins it lacks, in place, so the optimizer, its state and
    the wrapper's settings are kept. It splits nothing yet."""
    if not isinstance(wrapper, OptimWrapper) or isinstance(wrapper, OptimWrapperDict):
        raise ConfigError(f'MemoryBudgetHook needs one OptimWrapper; got '
                          f'{type(wrapper).__name__} (several optimizers are not supported)')
    if isinstance(wrapper, MicroBatching) and wrapper.micro_batching:
        raise ConfigError('MemoryBudgetHook chooses the micro-batches itself: remove '
                          'micro_batches / memory_budget from the optim_wrapper config')
    mixins = tuple(mixin for mixin, wanted in ((MicroBatching, True), (AutocastSwitch, autocast))
                   if wanted and not isinstance(wrapper, mixin))
    if mixins:
        _WRAPPER_SWAP.swap_in(wrapper, *mixins)
    wrapper.configure_micro_batching(MicroBatchConfig(1))
    return wrapper


def checkpointed_twice(model: nn.Module, cfg: dict) -> str | None:
    """The warning for a model that checkpoints its own blocks (timm's
    ``set_grad_checkpointing()``, ``with_cp=True``, MMEngine's ``activation_checkpointing`` in
    ``cfg``), which the hook's per-block checkpointing would checkpoint again; ``None`` when it
    does not."""
    own = own_checkpointing(model)
    if cfg.get('activation_checkpointing'):
        own.append('activation_checkpointing in the config')
    if not own:
        return None
    more = f' and {len(own) - 3} more' if len(own) > 3 else ''
    return (f'MemoryBudgetHook: the model checkpoints its own blocks ({", ".join(own[:3])}{more}):'
            ' a fractional budget is a share of that checkpointed step, and per-block '
            "checkpointing, one of the hook's candidates, would checkpoint them twice; switch it "
            'off and let the hook measure it')


def _rank0_chain(chain: Chain) -> Chain:
    """Rank 0's recorded step on every rank, so that all find the same checkpoint plans."""
    if not is_distributed():
        return chain
    shared = [chain]
    broadcast_object_list(shared, src=0)
    return shared[0]


def _max_over_ranks_seconds(seconds: float) -> float:
    """The longest of the processes' times, so that every process predicts the same."""
    value = torch.tensor([seconds], dtype=torch.float64)
    all_reduce(value, op='max')
    return float(value.item())


@HOOKS.register_module()
class MemoryBudgetHook(ShapeBucketHook):
    """Keep the peak of every training step within ``budget``, as fast as the techniques allow.

    Before the first iteration of each new input-shape bucket (as ``CheckpointPlanHook``), the
    hook measures the step on that batch: its peak with nothing applied (a trial pass whose
    gradients, buffers and RNG are put back), the bytes of the model's state, the time of
    passes of a few micro-batch sizes, one recorded forward pass for checkpoint plans, and,
    when lossy techniques are allowed, the peak and time under each of their settings. It
    predicts the peak and time of every combination, takes the fastest whose predicted peak
    is within the budget less 5%, applies it, and measures one micro-batch pass with it. If
    the measured peak is over the budget, later predictions' activations are corrected by how
    far that one's measured above its own, and the search runs again (at most three measured
    combinations). The decision table is logged and written to ``{work_dir}/memory_plan.json``
    (under the bucket's name, e.g. ``'32x1x128x128'``), and after the first iteration one line
    starting ``mmdropit: MemoryBudgetHook:`` says what was chosen, its measured peak and its
    time. A later run in the same work dir (``--resume``) whose budget, allowed techniques,
    batch shape, processes, parameters and optimizer are the same puts the saved decision in
    effect and measures it once instead; it is kept if it still fits.

    Techniques: micro-batches (1, 2, 4, ... and one per sample) and the fastest checkpoint
    plan that fits what they leave, which keep the gradients of the whole batch (BatchNorm
    layers in training mode see micro-batches: warned); with ``lossy`` or ``allow``, bfloat16
    autocast (``'bf16'``), DropIT at gamma 0.5 / 0.7 / 0.9 (``'dropit'``) and what
    normalisation, activation and attention modules save in 8 or 4 bits (``'quantize'``,
    :func:`~mmdropit.codecs.compress_activations`; left out of ``lossy=True`` for a model
    without such modules); with ``offload`` on a GPU, activation offload of the earliest
    blocks holding half or all of the saved bytes (:mod:`mmdropit.offload`; exact, each share
    measured like a lossy setting), and checkpoint plans keeping their checkpoints' inputs in
    host memory (:attr:`~mmdropit.checkpoint.CheckpointPlan.inputs_on_host`: per-block
    checkpointing's residual stream; the fastest plan searched so); with ``rebuild``, rebuilt
    activations (:mod:`mmdropit.codecs.rebuilt_activations`; exact, measured like a lossy
    setting; inside the plan's checkpoints they step aside). ``DropITHook``,
    ``CompressActivationsHook`` and mixed precision set in the config are kept and planned
    around (then not offered again);
    ``CheckpointPlanHook`` and an optim wrapper's own ``micro_batches`` / ``memory_budget`` are
    errors, as this hook chooses those; a model that checkpoints its own blocks is measured as
    it is, with a warning. Under DDP every rank measures, the largest peak and the longest time
    count, so all ranks take the same decision.

    Under ``torch.compile`` (``compile=True`` in the config) the trial passes run eagerly (a
    compiled trial would compile each combination anew), checkpoint plans are single-level (the
    compiled backward recomputes a nested checkpoint with the outer one), and activation
    offload and rebuilt activations are not offered (the compiler recomputes such outputs
    itself; quantized activations are: each converted module's hooks split
    the compiled graph there); the chosen combination is in effect when the compiled step is
    first traced. The decision's peak and time are those of eager
    passes; the compiled step's peak is measured on the next iteration of the same input-shape
    bucket (:class:`~mmdropit.memory.CompiledStepPeakMeter`) and given in the summary line;
    where it is above the budget the decision is made again for an eager budget lower by what
    compiling added (at most :data:`COMPILED_CORRECTIONS` times, then a warning).

    Args:
        budget: The peak of a whole training step (parameters, gradients, optimizer state,
            activations, temporaries): a size (``'11GB'``, ``'11GiB'``, bytes as int) or a
            fraction of the measured step peak with nothing applied (``0.5``), of each input-shape
            bucket's step, to no less than an earlier bucket was given (an epoch's smaller last
            batch need not go lower than the run already goes). On CUDA the peak is
            ``max_memory_allocated``; on CPU PyTorch's MemTracker. ``None``: the
            least peak the allowed techniques reach within ``max_slowdown`` (the three
            combinations predicted lowest are measured; the lowest is trained with, its peak
            logged as the budget).
        lossy: Also try every lossy technique (:data:`LOSSY`).
        allow: Lossy techniques to try, by name (instead of ``lossy=True``).
        offload: Also try activation offload, and checkpoint plans with their inputs in host
            memory (a model on a GPU only: on CPU nothing would move, and they are left out
            with a line in the log).
        rebuild: Also try rebuilt activations (a model with GELU / SiLU / Hardswish / Mish
            activations: otherwise, and under compile, left out with a line in the log).
        bucket: Spatial sizes are rounded up to a multiple of this before comparing shapes.
        max_slowdown: With ``budget=None``, the most time a combination may take, as a
            multiple of the plain step's measured time (at least 1), or ``None`` for the least
            peak whatever the time (one-sample micro-batches, tens of times slower).

    Raises:
        ConfigError: A malformed budget or an unknown technique (at build time); lossy
            techniques asked for when none can be added, offload in a compiled run, or
            ``RebuiltActivationsHook`` beside ``rebuild=True`` (before training); a budget
            below what the techniques reach (the message gives the least predicted peak).
    """

    priority = 'HIGH'  # after DropITHook (VERY_HIGH): plans the converted model

    def __init__(self, budget: float | int | str, lossy: bool = False,
                 allow: Sequence[str] | None = None, offload: bool = False,
                 bucket: int = 128, max_slowdown: float | None = LEAST_MAX_SLOWDOWN,
                 rebuild: bool = False) -> None:
        self.budget = parse_budget(budget, BUDGET_HELP)
        if max_slowdown is not None and (isinstance(max_slowdown, bool) or not isinstance(
                max_slowdown, (int, float)) or not max_slowdown >= 1):
            raise ConfigError(f'MemoryBudgetHook max_slowdown is a multiple of the step\'s time '
                              f'of at least 1 (e.g. 2.0), or None; got {max_slowdown!r}')
        self.max_slowdown = None if max_slowdown is None else float(max_slowdown)
        if isinstance(allow, str) or (allow is not None and not set(allow) <= set(LOSSY)):
            raise ConfigError(f'MemoryBudgetHook allow takes a list of lossy techniques from '
                              f'{list(LOSSY)}, got {allow!r}')
        super().__init__(bucket)
        self.lossy = tuple(LOSSY if lossy else allow or ())
        self._every_lossy = bool(lossy)
        self.offload = bool(offload)
        self.rebuild = bool(rebuild)
        self._target: _RunnerTarget | None = None
        self._step: MicroBatchTrainStep | None = None
        self._compiled_peaks: CompiledPeaks | None = None  # under compile only
        self._budgets: dict[ShapeKey, int | None] = {}  # each bucket's, before corrections

    def before_run(self, runner) -> None:
        if any(isinstance(hook, CheckpointPlanHook) for hook in runner.hooks):
            raise ConfigError('MemoryBudgetHook chooses the checkpoint plan itself: remove '
                              'CheckpointPlanHook from custom_hooks')
        compiled = compiles_model(runner)
        if compiled and self.offload:
            raise ConfigError('MemoryBudgetHook offload=True is not offered under compile (in '
                              'the config): drop one of the two')
        model = unwrap(runner.model)
        twice = checkpointed_twice(model, runner.cfg)
        if twice:
            runner.logger.warning(twice)
        if self.offload and any(isinstance(hook, ActivationOffloadHook) for hook in runner.hooks):
            raise ConfigError('MemoryBudgetHook offload=True chooses what to offload itself: '
                              'remove ActivationOffloadHook from custom_hooks')
        if self.rebuild and any(isinstance(hook, RebuiltActivationsHook)
                                for hook in runner.hooks):
            raise ConfigError('MemoryBudgetHook rebuild=True tries rebuilt activations itself: '
                              'remove RebuiltActivationsHook from custom_hooks')
        if self.rebuild and (compiled or not rebuildable_activations(model)):
            runner.logger.info('MemoryBudgetHook rebuild=True: ' + (
                'under compile the compiler recomputes activation outputs itself'
                if compiled else f'{type(model).__name__} has no GELU / SiLU / Hardswish / '
                'Mish activation') + '; not tried')
            self.rebuild = False
        if self.offload and model_device(model).type != 'cuda':
            runner.logger.info('MemoryBudgetHook offload=True: the model is not on a GPU, '
                               'where offload would move nothing; not tried')
            self.offload = False
        kept = {'bf16': isinstance(runner.optim_wrapper, AmpOptimWrapper),
                'dropit': bool(dropit_layers(model)),
                'quantize': any(isinstance(module, CompressedActivations)
                                for module in model.modules())}
        if 'quantize' in self.lossy and not kept['quantize'] and not compressible_modules(model):
            if not self._every_lossy:
                raise ConfigError(f'MemoryBudgetHook allow=[\'quantize\']: '
                                  f'{type(model).__name__} has no normalisation, activation or '
                                  'attention module whose saved tensors could be quantized')
            kept['quantize'] = True  # nothing to quantize: not offered
        if self.lossy and all(kept[name] for name in self.lossy):
            raise ConfigError(f'MemoryBudgetHook: no lossy technique left to add '
                              f'({", ".join(self.lossy)} already set in the config); drop '
                              'lossy / allow, or the settings in the config')
        self.lossy = tuple(name for name in self.lossy if not kept[name])
        wrapper = _prepared(runner.optim_wrapper, autocast='bf16' in self.lossy)
        wrapper.split_train_step(runner.model)  # FlexibleRunner counted before before_run
        self._step = runner.model.__dict__['train_step']  # before compile wraps it
        self._target = _RunnerTarget(model, wrapper)
        if compiled:
            self._compiled_peaks = CompiledPeaks(model, wrapper.optimizer)

    def leave(self, runner, outcome: BudgetOutcome) -> None:
        remove_all(outcome.techniques, self._target)

    def forget(self, key: ShapeKey) -> None:
        if self._compiled_peaks:  # the new decision's compiled step is measured again
            self._compiled_peaks.measured.pop(key, None)
            self._compiled_peaks.corrections.pop(key, None)

    def decision_summary(self, runner, key: ShapeKey, outcome: BudgetOutcome) -> str:
        decision = outcome.decision
        chosen = decision.chosen
        verb = 'kept the saved decision' if outcome.reused else 'chose'
        fit = (least_text(outcome.max_slowdown) if outcome.least else
               f'within budget {mib(self._budgets[key])}')
        compiled = self._compiled_peaks is not None
        eager = ', eager' if compiled else ''
        timed = decision.timed.get(chosen.summary)
        time = (f'{chosen.time_ratio:.2f}x the plain step\'s time (predicted{eager})'
                if timed is None else f'{timed:.2f}x the plain step\'s time (measured{eager})')
        peak = self._compiled_peaks.measured.get(key) if compiled else None
        peak = '' if peak is None else f'; the compiled step\'s peak {mib(peak)}'
        return (f'{verb} {chosen.summary}: measured peak {mib(decision.measured_bytes)}'
                f'{" (eager)" if compiled else ""}, {fit} (nothing applied: '
                f'{mib(outcome.unplanned_peak)}); {time}{peak}')

    def summary(self, runner) -> str | None:
        if self._compiled_peaks and self.current not in self._compiled_peaks.measured:
            return None  # said once the compiled step is measured
        return super().summary(runner)

    def enter(self, runner, outcome: BudgetOutcome) -> None:
        put_in_effect(outcome.decision.chosen, outcome.techniques, self._target)
        if self._compiled_peaks:
            self._compiled_peaks.entered()

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        super().before_train_iter(runner, batch_idx, data_batch)
        if self._compiled_peaks and isinstance(data_batch, dict) and self.current is not None:
            self._compiled_peaks.start(self.current)

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        peak = self._compiled_peaks.stop() if self._compiled_peaks else None
        if peak is not None:
            self._check_compiled(runner, data_batch, max_over_ranks(peak))
        super().after_train_iter(runner, batch_idx, data_batch, outputs)

    def _check_compiled(self, runner, data: dict, peak: int) -> None:
        """Keep the current bucket's decision if its compiled step's ``peak`` fits the budget;
        else decide again for a budget lower by what compiling added to its eager peak (at
        most :data:`COMPILED_CORRECTIONS` times, then warn)."""
        key, outcome, peaks = self.current, self.decisions[self.current], self._compiled_peaks
        budget = self._budgets[key]
        corrections = peaks.corrections.get(key, 0)
        if budget is None or peak <= budget or corrections >= COMPILED_CORRECTIONS:
            peaks.measured[key] = peak
            if budget is not None and peak > budget:
                runner.logger.warning(
                    f'MemoryBudgetHook: the compiled step peaked at {mib(peak)}, above the '
                    f'budget {mib(budget)}, after {corrections} decisions made again for it: '
                    f'lower the budget by {mib(peak - budget)} or more, or train without '
                    'compile')
            return
        peaks.corrections[key] = corrections + 1
        lower = budget - (peak - outcome.decision.measured_bytes)  # what it measured fits
        runner.logger.info(
            f'MemoryBudgetHook: the compiled step peaked at {mib(peak)}, above the budget '
            f'{mib(budget)} (its eager passes: {mib(outcome.decision.measured_bytes)}); deciding '
            f'again on eager passes for {mib(lower)}')
        self.leave(runner, outcome)
        try:
            outcome = self.decide(runner, data, key, lower=lower)
        except ConfigError:  # nothing reaches it: the search removed every technique
            peaks.measured[key] = peak
            runner.logger.warning(
                f'MemoryBudgetHook: the compiled step peaked at {mib(peak)}, above the budget '
                f'{mib(budget)}, and no combination reaches {mib(lower)} on eager passes: '
                'training on with it; raise the budget, or train without compile')
        self.decisions[key] = outcome
        self.enter(runner, outcome)

    def decide(self, runner, data: dict, key: ShapeKey, lower: int | None = None
               ) -> BudgetOutcome:
        """The decision for the bucket ``key`` within the hook's budget (the one saved in
        ``memory_plan.json`` by an earlier run when it still fits), or within ``lower`` bytes
        after the compiled step measured above the budget; logged and written to
        ``memory_plan.json``."""
        target, model = self._target, self._target.model
        wrapper = target.wrapper
        step = self._step
        data = largest_first(data)  # a trial of a few samples pads to the batch's shape
        probe = StepProbe(model, wrapper.optimizer, batch_size_of(data),
                          run_part=lambda size: step.run_part(data, size),
                          forward_part=lambda size: batch_loss(
                              model, first_samples(data, size),
                              lambda: wrapper.optim_context(model))(),
                          agree_peak=max_over_ranks, agree_seconds=_max_over_ranks_seconds,
                          share_chain=_rank0_chain,
                          accumulates=wrapper._accumulative_counts > 1)
        unavailable = quantize_unavailable(model) if 'quantize' in self.lossy else None
        if unavailable:
            runner.logger.warning(f'MemoryBudgetHook: {unavailable}')
        switches = [*([dropit_switch(model)] if 'dropit' in self.lossy else []),
                    *([quantize_switch(model)] if 'quantize' in self.lossy and not unavailable
                      else []),
                    *([bf16_switch(wrapper)] if 'bf16' in self.lossy else []),
                    *([offload_switch(model, lambda: probe.forward_part(
                        min(probe.batch_size, PART_SAMPLES)))] if self.offload else []),
                    *([rebuilt_switch(model)] if self.rebuild else [])]
        go_lower = ('lossy techniques (lossy=True), or ' if not self._every_lossy else '') \
            + (f'sharding over more than {get_world_size()} processes'
               if is_sharded(model.parameters()) else LOWER)
        name, where = shape_text(key), self.described[key]
        fingerprint = self._fingerprint(model, wrapper, key)
        saved = self._saved_decision(runner, name) if lower is None else None
        reuse = saved if isinstance(saved, dict) and saved.get('fingerprint') == fingerprint \
            else None
        fraction = isinstance(self.budget, float) and lower is None  # no less than given so far
        outcome = plan_within_budget(probe, self.budget if lower is None else lower, target,
                                     switches, go_lower, reuse, self.max_slowdown,
                                     nested=self._compiled_peaks is None,
                                     inputs_on_host=self.offload,
                                     at_least=max(self._budgets.values(), default=None)
                                     if fraction else None)
        if lower is None:
            self._budgets[key] = None if outcome.least else outcome.decision.budget_bytes
        if outcome.unused_saved:
            runner.logger.warning(
                f'MemoryBudgetHook: {Path(runner.work_dir) / "memory_plan.json"} holds a '
                f'decision for shape bucket {name} that this run cannot read '
                f'({outcome.unused_saved}): searched again, and written anew')
        runner.logger.info(f'MemoryBudgetHook for {where}: {outcome}')
        if get_rank() == 0:
            self._write(runner, name, dict(outcome.to_json(), fingerprint=fingerprint))
        return outcome

    def _fingerprint(self, model: nn.Module, wrapper: MicroBatching, key: ShapeKey) -> str:
        """What a saved decision is valid for: the budget (without one, ``max_slowdown``), the
        allowed techniques (with offload, the GPU: its host link sizes what moves), the batch
        shape, whether the step is compiled, the number of processes, the model's parameters
        and module classes (another hook's DropIT or compressed layers), the optimizer, and
        the optim wrapper's class, mixed precision and accumulation."""
        device = model_device(model)
        described = [repr(self.budget), sorted(self.lossy), self.offload, list(key),
                     *([torch.cuda.get_device_name(device)]
                       if self.offload and device.type == 'cuda' else []),
                     *(['rebuild'] if self.rebuild else []),
                     *([self.max_slowdown] if self.budget is None else []),
                     *(['compiled'] if self._compiled_peaks else []),
                     get_world_size(),
                     [(name, list(param.shape), str(param.dtype), param.requires_grad)
                      for name, param in model.named_parameters()],
                     sorted({type(module).__name__ for module in model.modules()}),
                     type(wrapper.optimizer).__name__, sorted(map(str, wrapper.param_groups[0])),
                     type(wrapper).__name__, str(getattr(wrapper, 'cast_dtype', None)),
                     wrapper._accumulative_counts]
        return hashlib.sha256(json.dumps(described).encode()).hexdigest()[:16]

    def _saved_decision(self, runner, name: str) -> object:
        """Rank 0's saved decision for the bucket ``name`` on every process (a node-local
        ``work_dir``, or a file system that shows the processes different versions of the file,
        must not send some to the reuse and the others to the search: their collectives
        differ)."""
        saved = [self._saved(runner).get(name) if get_rank() == 0 else None]
        if is_distributed():
            broadcast_object_list(saved, src=0)
        return saved[0]

    @staticmethod
    def _saved(runner, say: bool = True) -> dict:
        """The decisions written to ``{work_dir}/memory_plan.json`` by this or an earlier run
        (none, said in the log unless ``say`` is false, when the file is not readable JSON:
        they are made anew and the file written again)."""
        path = Path(runner.work_dir) / 'memory_plan.json'
        try:
            saved = json.loads(path.read_text()) if path.is_file() else {}
            if not isinstance(saved, dict):
                raise ValueError(f'a JSON {type(saved).__name__}, not decisions by input shape')
        except (OSError, ValueError) as error:
            if say:
                runner.logger.warning(f'MemoryBudgetHook: {path} is not readable ({error}); '
                                      'its decisions are made anew and the file written again')
            return {}
        return saved

    def _write(self, runner, where: str, decision: dict) -> None:
        """Add this bucket's decision to ``{work_dir}/memory_plan.json``."""
        saved = self._saved(runner, say=False)
        saved[where] = decision
        with atomic_write(Path(runner.work_dir) / 'memory_plan.json', 'w') as stream:
            stream.write(json.dumps(saved, indent=1))  # a kill mid-write leaves the old file
