"""Plan a training step within a memory budget: measure the step, build the techniques, decide.

What a step is, is given as a :class:`StepProbe` (how to run a trial pass of part of the batch,
how to run the forward pass for recording), so the same planning serves MMEngine runs
(``MemoryBudgetHook``) and the benchmark's workloads.

Example:
    >>> from torch import nn
    >>> from mmdropit.microbatch import micro_batch_sizes
    >>> net = nn.Sequential(nn.Linear(32, 64), *[nn.Sequential(nn.Linear(64, 64), nn.GELU())
    ...                                          for _ in range(6)], nn.Linear(64, 10))
    >>> x, y = torch.randn(512, 32), torch.randint(0, 10, (512,))
    >>> def loss(size=512):
    ...     return nn.functional.cross_entropy(net(x[:size]), y[:size]) * size / 512
    >>> class Split:                      # what the techniques are applied to
    ...     model, micro_batches = net, 1
    ...     def set_micro_batches(self, count):
    ...         self.micro_batches = count
    >>> probe = StepProbe(net, None, 512, run_part=lambda size: loss(size).backward(),
    ...                   forward_part=loss)
    >>> outcome = plan_within_budget(probe, 0.5, Split())
    >>> outcome.decision.measured_bytes <= outcome.decision.budget_bytes
    True
    >>> outcome.decision.chosen.summary != 'nothing'
    True
"""
from __future__ import annotations

import functools
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace

import torch
from torch import nn

from ..checkpoint import build_chain, record_step
from ..checkpoint.chain import Chain
from ..codecs import compress_activations, restore_activations
from ..common.budget import Budget, resolve_budget
from ..common.parameters import model_device
from ..dropit import convert, from_dropit
from ..errors import ConfigError
from ..memory import TrialPeaks, state_bytes, trial_peak, trial_peaks, trial_seconds
from ..microbatch import micro_batch_sizes
from ..offload import block_patterns, modules_holding_share, offload_activations, restore_offload
from .estimate import Choice, Effect, Estimate
from .search import LOWER, Decision, decide, decide_least, put_in_effect, remove_all
from .techniques import CheckpointPlans, MeasuredSettings, MicroBatches, Target, Technique

DROPIT_GAMMAS = (0.5, 0.7, 0.9)
"""The gammas DropIT is tried at when lossy techniques are allowed (the leanest last)."""
ACTIVATION_BITS = (8, 4)
"""The bit widths saved activations are tried at when lossy techniques are allowed (the leanest
last)."""
OFFLOAD_SHARES = (0.5, 1.0)
"""The shares of the saved bytes activation offload is tried at (on a GPU, when asked for)."""
PART_SAMPLES = 8
"""Lossy settings are measured, and the step is recorded for checkpoint plans, on half the
batch, at most this many samples (lossy settings also on an eighth of that): these passes are
most of a search at a large batch, and what they give holds at any batch size (a lossy setting's
effect is fitted as a share of the activations plus constant bytes; a plan's saving is a share
of the recorded activations, its recompute time a share of the recorded step's)."""


def _same(value):
    return value


@dataclass
class StepProbe:
    """How to measure one training step of a fixed batch.

    Attributes:
        model: The trained model (unwrapped): trials restore its gradients, buffers and RNG.
        optimizer: Its optimizer (its state, and what its first step creates, count).
        batch_size: Samples in the batch.
        run_part: ``run_part(size)``: the forward and backward pass of the batch's first
            ``size`` samples, the loss weighted by ``size / batch_size``, no optimizer step.
        forward_part: ``forward_part(size)``: the forward pass of the batch's first ``size``
            samples, returning the loss (recorded for checkpoint plans).
        agree_peak: Turns this process's measured peak (``None``: out of memory) into the one
            all processes use (e.g. the largest over ranks).
        agree_seconds: The same for a measured time.
        share_chain: The same for the recorded step (e.g. rank 0's, broadcast).
        accumulates: Gradients are accumulated over several batches (MMEngine's
            ``accumulative_counts``), so they are held while even an undivided batch runs.
        cold_new_shapes: The first pass of any new batch size is slow, not only of one larger
            than those before (new memory): on a GPU cuDNN and cuBLAS choose their kernels per
            shape (an H200 timed a 2-micro-batch split of ResNet-50 at 5.8x from one such
            pass). ``None``: whether the model is on a GPU.
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer | None
    batch_size: int
    run_part: Callable[[int], object]
    forward_part: Callable[[int], torch.Tensor]
    agree_peak: Callable[[int | None], int | None] = _same
    agree_seconds: Callable[[float], float] = _same
    share_chain: Callable[[Chain], Chain] = _same
    accumulates: bool = False
    cold_new_shapes: bool | None = None

    def __post_init__(self) -> None:
        if self.cold_new_shapes is None:
            self.cold_new_shapes = model_device(self.model).type == 'cuda'

    def peak(self, size: int, gradients_held: bool = True) -> int | None:
        """The agreed peak of a trial pass of ``size`` samples (``None``: out of memory), the
        parameters holding gradients from the start (as for a micro-batch after the first, and
        for every batch when gradients accumulate over batches) unless ``gradients_held`` is
        false."""
        held = gradients_held or self.accumulates
        return self.agree_peak(trial_peak(lambda: self.run_part(size), self.model,
                                          self.optimizer, gradients_held=held))

    def peaks(self, size: int) -> TrialPeaks:
        """The agreed peaks of a trial pass of ``size`` samples as it starts without gradients
        and with them held (:func:`~mmdropit.memory.trial_peaks`: one pass on CPU); both held
        when gradients accumulate over batches."""
        if self.accumulates:
            held = self.peak(size)
            return TrialPeaks(held, held)
        peaks = trial_peaks(lambda: self.run_part(size), self.model, self.optimizer)
        return TrialPeaks(self.agree_peak(peaks.fresh), self.agree_peak(peaks.held))

    def seconds(self, size: int, passes: int = 2) -> float:
        """The agreed time of a trial pass of ``size`` samples: the fastest of ``passes``
        passes (the first may be cold, unless a pass of the same size just ran)."""
        return self.agree_seconds(min(trial_seconds(lambda: self.run_part(size), self.model)
                                      for _ in range(passes)))

    def chain(self, size: int) -> Chain:
        """The recorded forward pass of the batch's first ``size`` samples, cut into the chain
        checkpoint plans are searched on."""
        step = functools.partial(self.forward_part, size)
        return self.share_chain(build_chain(record_step(self.model, step), self.model))


@dataclass(frozen=True)
class Switch:
    """A technique whose settings are each measured on the step: its settings, and how to put
    one in effect and take it away.

    Attributes:
        name: The technique's name (``'bf16'``, ``'dropit'``, ``'quantize'``, ``'offload'``).
        settings: The settings to try, the one that saves the most memory last.
        text: How the decision table names a setting.
        apply: Puts a setting in effect.
        remove: Takes it away.
        lossy: Whether it changes the computed gradients (all but activation offload).
    """

    name: str
    settings: tuple
    text: Callable[[object], str]
    apply: Callable[[object], None]
    remove: Callable[[], None]
    lossy: bool = True


def dropit_switch(model: nn.Module, gammas: Sequence[float] = DROPIT_GAMMAS) -> Switch:
    """DropIT on ``model`` (default layers and exclusions) at each of ``gammas``."""
    return Switch('dropit', tuple(gammas), lambda gamma: f'DropIT gamma {gamma}',
                  lambda gamma: convert(model, gamma), lambda: from_dropit(model))


def quantize_switch(model: nn.Module, bits: Sequence[int] = ACTIVATION_BITS) -> Switch:
    """What ``model``'s normalisation, activation and attention modules save, in each of
    ``bits`` bits (:func:`~mmdropit.codecs.compress_activations` with its default modules)."""
    return Switch('quantize', tuple(bits), lambda width: f'{width}-bit activations',
                  lambda width: compress_activations(model, width),
                  lambda: restore_activations(model))


def offload_switch(model: nn.Module, forward: Callable[[], object],
                   shares: Sequence[float] = OFFLOAD_SHARES) -> Switch:
    """Activation offload (:mod:`mmdropit.offload`) of the earliest blocks of ``model`` holding
    each of ``shares`` of the saved bytes of ``forward()`` (chosen when a share is first
    applied): exact, and worth trying on a GPU only (on CPU nothing moves)."""
    chosen: dict[float, list[str]] = {}

    def apply(share: float) -> None:
        if share not in chosen:
            chosen[share] = modules_holding_share(model, forward, block_patterns(model) or ['*'],
                                                  share)
        offload_activations(model, chosen[share])

    return Switch('offload', tuple(shares), lambda share: f'offload {share} of the saved bytes',
                  apply, lambda: restore_offload(model), lossy=False)


def bf16_switch(holder: object) -> Switch:
    """bfloat16 autocast, switched by setting ``holder.autocast_dtype`` (an optim wrapper with
    :class:`~mmdropit.engine.optim.AutocastSwitch`, a benchmark workload)."""
    return Switch('bf16', (torch.bfloat16,), lambda dtype: 'bf16 autocast',
                  lambda dtype: setattr(holder, 'autocast_dtype', dtype),
                  lambda: setattr(holder, 'autocast_dtype', None))


@dataclass
class BudgetOutcome:
    """What :func:`plan_within_budget` measured and decided.

    Attributes:
        decision: The decision (its combination is in effect).
        techniques: The techniques it chose among (to apply or remove the decision again).
        unplanned_peak: The measured step peak with nothing applied (the parameters hold no
            gradient when it starts, unless gradients accumulate over batches).
        fixed_bytes: Parameters, gradients, buffers and optimizer state.
        seconds: Time spent measuring, searching and proving the decision.
        reused: Whether the decision is an earlier run's, measured again and kept.
        least: Whether the budget was the least peak the techniques reach (the decision's
            budget is then that measured peak).
    """

    decision: Decision
    techniques: list[Technique] = field(default_factory=list)
    unplanned_peak: int = 0
    fixed_bytes: int = 0
    seconds: float = 0.0
    reused: bool = False
    least: bool = False

    def to_json(self) -> dict:
        """The decision as JSON: what :func:`plan_within_budget` reads back as ``saved``, and
        the figures and table behind it."""
        chosen = self.decision.chosen
        return dict(budget_bytes=self.decision.budget_bytes,
                    unplanned_peak_bytes=self.unplanned_peak, fixed_bytes=self.fixed_bytes,
                    measured_peak_bytes=self.decision.measured_bytes,
                    predicted_peak_bytes=chosen.peak_bytes,
                    predicted_time_ratio=chosen.time_ratio, chosen=chosen.summary,
                    choices=encode_choices(chosen, self.techniques),
                    decided_seconds=self.seconds, reused=self.reused,
                    table=self.decision.table().splitlines())

    def __str__(self) -> str:
        mib = 2**20
        decision = self.decision
        budget = ('the least peak the techniques reach' if self.least
                  else f'budget {decision.budget_bytes / mib:.1f} MiB')
        if self.reused:
            return (f'{budget}; the earlier run\'s decision '
                    f'{decision.chosen.summary} is kept: measured peak '
                    f'{decision.measured_bytes / mib:.1f} MiB')
        return (f'{budget} (step peak with nothing applied '
                f'{self.unplanned_peak / mib:.1f} MiB, of which parameters, gradients, buffers '
                f'and optimizer state {self.fixed_bytes / mib:.1f} MiB); chosen: '
                f'{decision.chosen.summary}, measured peak {decision.measured_bytes / mib:.1f} '
                f'MiB; decided in {self.seconds:.1f} s\n{decision.table()}')


def encode_choices(estimate: Estimate, techniques: Sequence[Technique]) -> list[dict]:
    """``estimate``'s choices as JSON (each technique encodes its own setting)."""
    by_name = {technique.name: technique for technique in techniques}
    return [dict(technique=choice.technique, setting=by_name[choice.technique].encode(
        choice.setting), text=choice.text) for choice in estimate.choices]


def decode_choices(rows: Sequence[dict], techniques: Sequence[Technique]) -> tuple[Choice, ...]:
    """The choices :func:`encode_choices` wrote, for these ``techniques``.

    Raises:
        ConfigError: A row names a technique that is not among them (the saved decision is
            for other settings).
    """
    by_name = {technique.name: technique for technique in techniques}
    unknown = [row['technique'] for row in rows if row['technique'] not in by_name]
    if unknown:
        raise ConfigError(f'the saved memory decision uses {", ".join(unknown)}, which this '
                          'run does not allow')
    return tuple(Choice(row['technique'], by_name[row['technique']].decode(row['setting']),
                        row['text']) for row in rows)


def per_pass_bytes(batch_size: int, activations: int, one_sample: Callable[[], int]) -> int:
    """Bytes a pass holds beyond the model's state whatever its size (FSDP2's gathered
    parameters, workspaces), on the line through the activations of the whole batch and of
    ``one_sample()`` (0 when that line says less, or one sample cannot train alone).

    Example:
        >>> per_pass_bytes(16, 16 * 10 + 40, lambda: 10 + 40)
        40
    """
    if batch_size < 2:
        return 0
    try:
        single = one_sample()
    except (RuntimeError, ValueError):  # e.g. BatchNorm1d cannot train on one sample
        return 0
    return max((batch_size * single - activations) // (batch_size - 1), 0)


def _measured(probe: StepProbe, switch: Switch, held: Callable[[], int],
              sizes: Callable[[], list[int]], plain_peak: Callable[[int], int],
              plain_seconds: Callable[[], float]) -> MeasuredSettings:
    """``switch`` as a technique; each setting's peak is measured on the batch's first
    ``sizes()`` samples (one or two sizes, smaller first) when first needed, and its time on the
    largest of them, against ``plain_peak(size)`` and ``plain_seconds()``, those of the same
    samples without it, less ``held()``, what every pass holds anyway
    (:meth:`~.techniques.Effect.from_peaks`; a setting under which they run out of memory is
    not offered). One timed pass follows the measured one, which warms it up: a lossy choice
    is timed again before it is kept."""
    def effect_of(setting: object) -> Effect | None:
        measured_sizes = sizes()
        without = [plain_peak(size) - held() for size in measured_sizes]  # before it applies
        switch.apply(setting)
        try:
            peaks = [probe.peak(size) for size in measured_sizes]
            if None in peaks:
                return None
            duration = probe.seconds(measured_sizes[-1], passes=1)
        finally:
            switch.remove()
        return Effect.from_peaks(without, [peak - held() for peak in peaks],
                                 duration / plain_seconds())

    return MeasuredSettings(switch.name, switch.settings, effect_of, switch.text, switch.apply,
                            switch.remove, lossy=switch.lossy)


def plan_within_budget(probe: StepProbe, budget: Budget, target: Target,
                       switches: Sequence[Switch] = (), lower: str = LOWER,
                       saved: dict | None = None) -> BudgetOutcome:
    """Measure the step, and put in effect the fastest combination of techniques whose measured
    peak fits ``budget``.

    Techniques, in the order they are applied: the ``switches`` (lossy ones), micro-batches,
    and the fastest checkpoint plan that fits what they leave (searched on the step recorded
    with nothing applied). A lossy decision is timed beside the fastest exact combination that
    fits, which is taken unless the lossy one is more than 5% faster (see
    :func:`~.search.decide`).

    Args:
        probe: How to measure the step.
        budget: A fraction of the measured step peak with nothing applied, bytes (as
            :func:`~mmdropit.common.parse_budget` returns them), or ``None``: the least peak
            the techniques reach (:func:`~.search.decide_least`; its measured peak becomes the
            decision's budget; each switch is tried at its leanest setting only).
        target: What the techniques are applied to.
        switches: Lossy techniques to try too.
        lower: What would go lower than these techniques, for the error message.
        saved: A decision an earlier run made for this step (:meth:`BudgetOutcome.to_json`):
            it is put in effect and measured once, and kept if it still fits its budget (a
            resumed run starts at once); otherwise the step is measured and planned anew.

    Raises:
        ConfigError: The batch runs out of memory with nothing applied, or no combination
            fits (see :func:`~.search.decide`).
    """
    started = time.perf_counter()
    fixed = state_bytes(probe.model, probe.optimizer)
    whole = budget_bytes = per_pass = 0  # measured below, before anything is searched

    warm: set[int] = set()  # sizes a pass has run at: one timed pass of them is enough

    def peak_of(size: int) -> int | None:
        warm.add(size)
        return probe.peak(size)

    @functools.cache
    def seconds_of(size: int) -> float:
        # the first pass of a size larger than any before may be cold (new memory); on a GPU
        # that of any size not run before
        cold = size not in warm and (probe.cold_new_shapes or not warm or size > max(warm))
        passes = 2 if cold else 1
        warm.add(size)
        return probe.seconds(size, passes)

    def step_seconds() -> float:
        return seconds_of(probe.batch_size)

    # lossy settings are measured on a part of the batch and on an eighth of it, to tell
    # bytes they add whatever the batch (bf16's cast weights) from a share of the activations
    part = min((probe.batch_size + 1) // 2, PART_SAMPLES)

    @functools.cache
    def plain_peak(size: int) -> int:
        return whole if size == probe.batch_size else peak_of(size) or whole

    @functools.cache
    def lossy_sizes() -> list[int]:
        small = max(part // 8, 1)
        try:
            plain_peak(small)
        except (RuntimeError, ValueError):  # e.g. BatchNorm1d cannot train on one sample
            return [part]
        return sorted({small, part})

    def record_plain_step() -> Chain:
        remove_all(techniques, target)  # a measured combination may still be in effect
        return probe.chain(part)

    if budget is None:  # the least peak: a setting another one saves more than cannot give it
        switches = [replace(switch, settings=switch.settings[-1:]) for switch in switches]
    micro_batches = MicroBatches(probe.batch_size, seconds_of)
    techniques = [*(_measured(probe, switch, lambda: fixed + per_pass, lossy_sizes, plain_peak,
                              functools.partial(seconds_of, part)) for switch in switches),
                  micro_batches, CheckpointPlans(record_plain_step,
                                                 functools.partial(seconds_of, part))]

    def measure(estimate: Estimate) -> int:
        put_in_effect(estimate, techniques, target)
        size = micro_batch_sizes(probe.batch_size, estimate.setting('micro-batches', 1))[0]
        peak = probe.peak(size, gradients_held=size < probe.batch_size)
        # out of memory: halve the target (rank last, for the least peak)
        return 2 * (budget_bytes or whole) if peak is None else peak

    def measure_seconds(estimate: Estimate) -> float:
        put_in_effect(estimate, techniques, target)
        sizes = Counter(micro_batch_sizes(probe.batch_size, estimate.setting('micro-batches', 1)))
        # one timed pass per size: the combination's measured pass warmed it up
        return sum(count * probe.seconds(size, passes=1)
                   for size, count in sizes.items()) / step_seconds()

    if saved is not None:
        budget_bytes = saved['budget_bytes']
        chosen = Estimate(fixed, max(saved['predicted_peak_bytes'] - fixed, 0),
                          saved['predicted_time_ratio'], decode_choices(saved['choices'],
                                                                        techniques))
        peak = measure(chosen)
        if budget is None or peak <= budget_bytes:  # the least peak: kept as it measures
            decision = Decision(peak if budget is None else budget_bytes, chosen, peak,
                                [chosen], {chosen.summary: peak})
            return BudgetOutcome(decision, techniques, saved['unplanned_peak_bytes'], fixed,
                                 time.perf_counter() - started, reused=True,
                                 least=budget is None)
        remove_all(techniques, target)
    # the step as it is, and with gradients held, as every later part holds them
    warm.add(probe.batch_size)
    peaks = probe.peaks(probe.batch_size)
    unplanned, whole = peaks.fresh, peaks.held
    if unplanned is None or whole is None:
        raise ConfigError('the batch ran out of memory with nothing applied: lower the batch '
                          'size')
    budget_bytes = resolve_budget(budget, unplanned)
    micro_batches.undivided_saving = max(whole - unplanned, 0)
    per_pass = per_pass_bytes(probe.batch_size, whole - fixed, lambda: plain_peak(1) - fixed)
    start = Estimate(fixed + per_pass, max(whole - fixed - per_pass, 0))
    try:
        if budget_bytes is None:
            decision = decide_least(start, techniques, measure)
            put_in_effect(decision.chosen, techniques, target)
        else:
            decision = decide(start, techniques, budget_bytes, measure, lower, measure_seconds)
    except BaseException:
        remove_all(techniques, target)  # a failed search leaves the model as it was
        raise
    return BudgetOutcome(decision, techniques, unplanned, fixed, time.perf_counter() - started,
                         least=budget is None)
