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
from collections.abc import Sequence
from dataclasses import replace

from ..common.budget import Budget, resolve_budget
from ..errors import ConfigError
from .combinations import put_in_effect
from .decision import Decision
from .estimate import Estimate
from .least import LEAST_MAX_SLOWDOWN, decide_least
from .measurements import Measurements
from .outcome import BudgetOutcome, decode_choices
from .probe import StepProbe
from .search import LOWER, decide
from .shortlist import choose_measured
from .switches import Switch
from .techniques import Target
from .trials import Trials


def plan_within_budget(probe: StepProbe, budget: Budget, target: Target,
                       switches: Sequence[Switch] = (), lower: str = LOWER,
                       saved: dict | None = None,
                       max_slowdown: float | None = LEAST_MAX_SLOWDOWN,
                       nested: bool = True, inputs_on_host: bool = False,
                       at_least: int | None = None) -> BudgetOutcome:
    """Measure the step, and put in effect the fastest combination of techniques whose measured
    peak fits ``budget``.

    Techniques, in the order they are applied: the ``switches`` (lossy ones), micro-batches,
    and the fastest checkpoint plan that fits what they leave (searched on the step recorded
    with nothing applied), or per-block checkpointing. The search's choice
    (:func:`~.search.decide`) is measured beside a shortlist of others predicted to fit (the
    fastest exact one, per-block checkpointing, the two fastest with bf16 as their only lossy
    technique, nothing where nothing is needed), and the fastest measured to fit is taken
    (:func:`~.shortlist.choose_measured`; a lossy one only if more than 5% faster than the
    fastest exact one).

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
            resumed run starts at once); otherwise, or when it cannot be read (the outcome's
            ``unused_saved`` says why), the step is measured and planned anew.
        max_slowdown: With ``budget=None``, the most measured time a combination may take,
            as a multiple of the plain step's (:data:`~.least.LEAST_MAX_SLOWDOWN`; ``None``:
            no bound).
        nested: Whether checkpoint plans may nest checkpoints; ``False`` for a step trained
            under ``torch.compile``, whose compiled backward recomputes a nested checkpoint
            with the outer one (see :func:`~mmdropit.checkpoint.plan_checkpoints`).
        inputs_on_host: Whether checkpoint plans are also offered with their checkpoints'
            inputs in host memory (a model on a GPU; see
            :class:`~.checkpoint_plans.CheckpointPlans`).
        at_least: Bytes a budget in bytes or a fraction resolves to at the least (what an
            earlier decision of the run was given: a smaller batch, as an epoch's last, need not
            go lower than the run already goes); ``None``: no floor.

    Raises:
        ConfigError: The batch runs out of memory with nothing applied, or no combination
            fits (see :func:`~.search.decide`).
    """
    started = time.perf_counter()
    least = budget is None
    bound = max_slowdown if least else None  # the outcome's: no budget, no time bound
    if least:  # a setting another one saves more than cannot give the least peak
        switches = [replace(switch, settings=switch.settings[-1:]) for switch in switches]
    trials = Trials(Measurements(probe), switches, target, nested, inputs_on_host)
    unused = ''
    if saved is not None:
        try:
            chosen = _saved_choice(saved, trials)
        except (ConfigError, KeyError, TypeError, ValueError, IndexError) as error:
            unused = str(error) or type(error).__name__  # searched again below
        else:
            outcome = _reuse_saved(saved, chosen, trials, bound, least, started)
            if outcome is not None:
                return outcome
    unplanned, start = _measure_unplanned(trials, budget, at_least)
    try:
        decision = _search(start, trials, lower, unplanned, bound)
    except BaseException:
        trials.remove_all()  # a failed search leaves the model as it was
        raise
    decision.out_of_memory = set(trials.out_of_memory)
    return BudgetOutcome(decision, trials.techniques, unplanned, trials.measurements.fixed,
                         time.perf_counter() - started, least=least, max_slowdown=bound,
                         unused_saved=unused,
                         unplanned_predicted_from=trials.measurements.predicted_from)


def _saved_choice(saved: dict, trials: Trials) -> Estimate:
    """The combination a ``saved`` decision chose, read for this run's techniques.

    Raises:
        ConfigError, KeyError, TypeError, ValueError, IndexError: A decision this run cannot
            read (edited, truncated, or for other techniques).
    """
    fixed = trials.measurements.fixed
    for key in ('budget_bytes', 'unplanned_peak_bytes'):
        if not isinstance(saved[key], int):
            raise TypeError(f'{key} {saved[key]!r} is not a number of bytes')
    return Estimate(fixed, max(int(saved['predicted_peak_bytes']) - fixed, 0),
                    float(saved['predicted_time_ratio']),
                    decode_choices(saved['choices'], trials.techniques))


def _reuse_saved(saved: dict, chosen: Estimate, trials: Trials, max_slowdown: float | None,
                 least: bool, started: float) -> BudgetOutcome | None:
    """Put ``chosen``, the ``saved`` decision's combination, in effect and measure it once:
    its outcome when it fits its budget (for the least peak, kept as it measures unless it
    runs out of memory); ``None``, every technique removed, when it does not."""
    fixed = trials.measurements.fixed
    trials.budget_bytes = saved['budget_bytes']
    peak = trials.peak(chosen)
    if chosen.summary in trials.out_of_memory or not least and peak > trials.budget_bytes:
        trials.remove_all()
        return None
    decision = Decision(peak if least else trials.budget_bytes, chosen, peak, [chosen],
                        {chosen.summary: peak})
    predicted_from = saved.get('unplanned_predicted_from', 0)
    return BudgetOutcome(decision, trials.techniques, saved['unplanned_peak_bytes'], fixed,
                         time.perf_counter() - started, reused=True, least=least,
                         max_slowdown=max_slowdown,
                         unplanned_predicted_from=predicted_from
                         if isinstance(predicted_from, int) else 0)


def _measure_unplanned(trials: Trials, budget: Budget,
                       at_least: int | None) -> tuple[int, Estimate]:
    """Measure the step with nothing applied, and resolve ``budget`` against its peak, to no
    less than ``at_least`` bytes (a budget at or above the peak of a batch that ran out of
    memory is lowered below it).

    Returns:
        The step's peak as it starts, and the step as the search starts from it (gradients
        held, as every later part holds them).

    Raises:
        ConfigError: The batch runs out of memory.
    """
    measurements = trials.measurements
    unplanned = measurements.unplanned_peak()
    trials.budget_bytes = resolve_budget(budget, unplanned)
    if trials.budget_bytes is not None and at_least is not None:
        trials.budget_bytes = max(trials.budget_bytes, at_least)
    if measurements.predicted_from and trials.budget_bytes is not None:
        trials.budget_bytes = min(trials.budget_bytes, unplanned - 1)  # it ran out of memory
    trials.micro_batches.undivided_saving = max(measurements.whole - unplanned, 0)
    held = measurements.held()
    return unplanned, Estimate(held, max(measurements.whole - held, 0))


def _search(start: Estimate, trials: Trials, lower: str, unplanned: int,
            max_slowdown: float | None) -> Decision:
    """The decision for :attr:`Trials.budget_bytes`: the search's choice
    (:func:`~.search.decide`) measured beside a shortlist of others, the fastest measured to
    fit taken (:func:`~.shortlist.choose_measured`); or the decision for the least peak
    (:func:`~.least.decide_least`, within ``max_slowdown``). Its combination is in effect."""
    if trials.budget_bytes is None:
        decision = decide_least(start, trials.techniques, trials.peak, max_slowdown,
                                trials.first_seconds)
        put_in_effect(decision.chosen, trials.techniques, trials.target)
        return decision
    decision = decide(start, trials.techniques, trials.budget_bytes, trials.peak, lower)
    return choose_measured(decision, trials, start, unplanned)
