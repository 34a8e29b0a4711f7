"""Plan a training step within a memory budget: measure the step, build the techniques, decide.

What a step is, is given as a :class:`~.probe.StepProbe` (how to run a trial pass of part of the
batch, how to run the forward pass for recording), so the same planning serves MMEngine runs
(``MemoryBudgetHook``) and the benchmark's workloads.

Example:
    >>> import torch
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

import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import replace

from ..checkpoint.chain import Chain
from ..common.budget import Budget, resolve_budget
from ..microbatch import micro_batch_sizes
from .combinations import put_in_effect, remove_all
from .decision import Decision
from .estimate import Estimate
from .least import decide_least
from .measurements import Measurements
from .outcome import BudgetOutcome, decode_choices
from .probe import StepProbe
from .search import LOWER, decide
from .switches import Switch
from .techniques import CheckpointPlans, MicroBatches, Target, Technique


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
            the techniques reach (:func:`~.least.decide_least`; its measured peak becomes the
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
    least = budget is None
    if least:  # a setting another one saves more than cannot give the least peak
        switches = [replace(switch, settings=switch.settings[-1:]) for switch in switches]
    trials = _Trials(Measurements(probe), switches, target)
    if saved is not None:
        outcome = _reuse_saved(saved, trials, least, started)
        if outcome is not None:
            return outcome
    unplanned, start = _measure_unplanned(trials, budget)
    try:
        decision = _search(start, trials, lower)
    except BaseException:
        trials.remove_all()  # a failed search leaves the model as it was
        raise
    return BudgetOutcome(decision, trials.techniques, unplanned, trials.measurements.fixed,
                         time.perf_counter() - started, least=least)


class _Trials:
    """The techniques of one planning run, and their combinations put in effect on the target
    and measured.

    Args:
        measurements: The step's passes measured in this run.
        switches: The techniques whose settings are measured on the step.
        target: What the techniques are applied to.

    Attributes:
        micro_batches: The micro-batches technique.
        techniques: The switches', micro-batches and checkpoint plans, in the order they are
            applied.
        budget_bytes: The budget the combinations are measured for (``None``: the least peak).
    """

    def __init__(self, measurements: Measurements, switches: Sequence[Switch],
                 target: Target) -> None:
        self.measurements, self.target = measurements, target
        self.micro_batches = MicroBatches(measurements.probe.batch_size, measurements.seconds_of)
        self.techniques: list[Technique] = [
            *(measurements.technique(switch) for switch in switches), self.micro_batches,
            CheckpointPlans(self.record_plain_step, measurements.part_seconds)]
        self.budget_bytes: int | None = 0

    def record_plain_step(self) -> Chain:
        """The step recorded on :attr:`~.measurements.Measurements.part` samples, every
        technique removed first (a measured combination may still be in effect)."""
        self.remove_all()
        return self.measurements.probe.chain(self.measurements.part)

    def remove_all(self) -> None:
        """Remove every technique from the target."""
        remove_all(self.techniques, self.target)

    def peak(self, estimate: Estimate) -> int:
        """Put ``estimate`` in effect and measure the peak of its largest pass (gradients held
        when the batch is split). Out of memory measures twice the budget (twice the step's
        peak for the least peak): the search halves its target, and ranks it last."""
        put_in_effect(estimate, self.techniques, self.target)
        batch_size = self.measurements.probe.batch_size
        size = micro_batch_sizes(batch_size, estimate.setting('micro-batches', 1))[0]
        peak = self.measurements.probe.peak(size, gradients_held=size < batch_size)
        return 2 * (self.budget_bytes or self.measurements.whole) if peak is None else peak

    def seconds(self, estimate: Estimate) -> float:
        """Put ``estimate`` in effect and measure its step time as a ratio to the step's with
        nothing applied: one timed pass per micro-batch size (the combination's measured pass
        warmed it up)."""
        put_in_effect(estimate, self.techniques, self.target)
        probe = self.measurements.probe
        sizes = Counter(micro_batch_sizes(probe.batch_size, estimate.setting('micro-batches', 1)))
        passes = sum(count * probe.seconds(size, passes=1) for size, count in sizes.items())
        return passes / self.measurements.seconds_of(probe.batch_size)


def _reuse_saved(saved: dict, trials: _Trials, least: bool,
                 started: float) -> BudgetOutcome | None:
    """Put the ``saved`` decision in effect and measure it once: its outcome when it fits its
    budget (for the least peak, kept as it measures); ``None``, every technique removed, when
    it does not."""
    fixed = trials.measurements.fixed
    trials.budget_bytes = saved['budget_bytes']
    chosen = Estimate(fixed, max(saved['predicted_peak_bytes'] - fixed, 0),
                      saved['predicted_time_ratio'],
                      decode_choices(saved['choices'], trials.techniques))
    peak = trials.peak(chosen)
    if not least and peak > trials.budget_bytes:
        trials.remove_all()
        return None
    decision = Decision(peak if least else trials.budget_bytes, chosen, peak, [chosen],
                        {chosen.summary: peak})
    return BudgetOutcome(decision, trials.techniques, saved['unplanned_peak_bytes'], fixed,
                         time.perf_counter() - started, reused=True, least=least)


def _measure_unplanned(trials: _Trials, budget: Budget) -> tuple[int, Estimate]:
    """Measure the step with nothing applied, and resolve ``budget`` against its peak.

    Returns:
        The step's peak as it starts, and the step as the search starts from it (gradients
        held, as every later part holds them).

    Raises:
        ConfigError: The batch runs out of memory.
    """
    measurements = trials.measurements
    unplanned = measurements.unplanned_peak()
    trials.budget_bytes = resolve_budget(budget, unplanned)
    trials.micro_batches.undivided_saving = max(measurements.whole - unplanned, 0)
    held = measurements.held()
    return unplanned, Estimate(held, max(measurements.whole - held, 0))


def _search(start: Estimate, trials: _Trials, lower: str) -> Decision:
    """The decision for :attr:`_Trials.budget_bytes` (:func:`~.search.decide`), or for the
    least peak (:func:`~.least.decide_least`); its combination is in effect."""
    if trials.budget_bytes is None:
        decision = decide_least(start, trials.techniques, trials.peak)
        put_in_effect(decision.chosen, trials.techniques, trials.target)
        return decision
    return decide(start, trials.techniques, trials.budget_bytes, trials.peak, lower,
                  trials.seconds)
