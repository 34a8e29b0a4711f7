"""``plan_checkpoints``: record a step, search the best plan, and apply it to a model.

Example::

    import mmdropit
    plan = mmdropit.plan_checkpoints(model, lambda: criterion(model(x), y), budget=0.5)
    print(plan)           # which modules are checkpointed, predicted memory and time
    plan.apply(model)     # train as usual; plan.remove(model), or the returned handle's
                          # remove(), undoes it
    plan.save('plan.json'); plan = CheckpointPlan.load('plan.json')

A budget is ``None`` (the least memory any plan reaches, within 1/32, and among those plans
the fastest), a fraction of the unplanned step's activation peak (``0.5``), or a size (``'4GB'``,
bytes as int).
"""
from __future__ import annotations

import json
import time
import warnings
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from typing import ClassVar
from pathlib import Path

from torch import nn

from ..common.budget import Budget, parse_budget, resolve_budget
from ..common.files import atomic_write
from ..common.host_copies import HostCopies, HostGroup
from ..common.technique import Applied
from ..common.units import mib
from ..errors import ConfigError
from .apply import (checkpoint_module, checkpoint_run, checkpoint_siblings, is_checkpointed,
                    uncheckpoint_all)
from .chain import DEFAULT_GRANULARITY, Chain, Segment, build_chain
from .cost import ChainCosts, Prediction, SegmentCost, chain_costs, predict
from .nested import with_nested
from .record import record_step
from .solver import least_ogc_cost, least_peak, least_time
from .targets import (ModuleTarget, RunTarget, SiblingsTarget, Target, targets_from_json,
                      targets_to_json, walk)

BISECTION_STEPS = 6
"""Steps from the additive model's limit to the exact budget (the last one is within 1/64)."""

OBJECTIVES = ('peak', 'ogc')

BUDGET_HELP = ("a checkpoint budget is None (least memory), a fraction of the baseline activation "
               "peak such as 0.5, or a size such as '4GB' or '512MiB'")
"""What a valid checkpoint budget is (the error message of a malformed one)."""

LEAST_MEMORY_TOLERANCE = 32
"""A least-memory plan is the fastest plan whose predicted peak is within
``1 / LEAST_MEMORY_TOLERANCE`` of the least reachable one: the last bytes can cost much time
(DenseNet-121, batch 16: the plan at the least predicted peak measured 1.58x the unplanned step
time, a single-level plan at the same measured peak 1.26x)."""


@dataclass(frozen=True)
class CheckpointPlan:
    """Which modules to checkpoint, and what the cost model expects of it: the checkpoint
    plan's configuration, checked when it is made, put on a model by :meth:`apply`.

    Attributes:
        targets: The checkpoints (:mod:`.targets`): a module (every call of it is one
            checkpoint), a run of children of an ``nn.Sequential``, or a run of siblings that
            their parent calls one after another, each maybe selective
            (:mod:`.selective`); checkpoints nested in one are in its ``inner``. The JSON form
            (:meth:`to_json`) is the flat list of earlier versions.
        budget: The budget asked for (``None``: least memory).
        baseline: Prediction for the step without checkpoints.
        planned: Prediction for the step with this plan.
        forward_seconds: Forward time of the recorded step.
        planning_seconds: Time spent recording and searching.
        inputs_on_host: Whether the top-level checkpoints keep their inputs in pinned host
            memory (:mod:`.apply`; on a GPU, where the plan's kept bytes are mostly those
            inputs, as per-block checkpointing's residual stream); ``planned`` then predicts
            the device's bytes (:func:`~.cost.predict`).
        host_checkpoints: With ``inputs_on_host``, the positions in ``targets`` (in the forward
            pass's order in every plan the search makes) of the top-level checkpoints that keep
            their inputs in host memory (``None``: all, also those whose copies free nothing);
            the others keep theirs on the device, where the host link would not carry them
            while the forward pass runs or where their copy would free nothing
            (:func:`~.cost.hosted_checkpoints`, which :meth:`with_inputs_on_host` and the search
            use to choose them).

    Raises:
        ConfigError: A target that is not a ``ModuleTarget`` / ``RunTarget`` /
            ``SiblingsTarget``, a malformed budget, or ``host_checkpoints`` that is not an
            increasing sequence of positions in ``targets`` of a plan with ``inputs_on_host``.

    Example:
        >>> from torch import nn
        >>> net = nn.Sequential(nn.Linear(4, 4), nn.GELU(), nn.Linear(4, 4))
        >>> with CheckpointPlan([RunTarget('', 0, 1)]).apply(net) as applied:
        ...     applied.summary
        'checkpoint plan of 1 checkpoint'
        >>> with CheckpointPlan([RunTarget('', 0, 1)], inputs_on_host=True).apply(net) as applied:
        ...     applied.summary, applied.host.stats.bytes_moved  # a CPU model: nothing moves
        ('checkpoint plan of 1 checkpoint, its inputs in host memory', 0)
        >>> CheckpointPlan([ModuleTarget('0'), ModuleTarget('2')], inputs_on_host=True,
        ...                host_checkpoints=[1]).host_summary
        'the inputs of 1 of its 2 in host memory'
        >>> CheckpointPlan(['0'])  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        mmdropit.errors.ConfigError: a checkpoint plan's targets are ModuleTarget, ...; got '0'
    """

    name: ClassVar[str] = 'checkpoint_plan'
    lossy: ClassVar[bool] = False

    targets: list[Target] = field(default_factory=list)
    budget: Budget = None
    baseline: Prediction | None = None
    planned: Prediction | None = None
    forward_seconds: float = 0.0
    planning_seconds: float = 0.0
    inputs_on_host: bool = False
    host_checkpoints: tuple[int, ...] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.inputs_on_host, bool):
            raise ConfigError('a checkpoint plan\'s inputs_on_host is True or False, got '
                              f'{self.inputs_on_host!r}')
        chosen = self.host_checkpoints
        if chosen is not None:
            if (not self.inputs_on_host or not isinstance(chosen, (list, tuple, range))
                    or not chosen
                    or any(type(k) is not int for k in chosen)
                    or list(chosen) != sorted(set(chosen))
                    or not 0 <= chosen[0] <= chosen[-1] < len(self.targets)):
                raise ConfigError(
                    "a checkpoint plan's host_checkpoints lists the positions in its targets of "
                    'the top-level checkpoints that keep their inputs in host memory, '
                    f'increasing, from 0 to {len(self.targets) - 1}, with inputs_on_host True '
                    f'(or is None for all); got {chosen!r}')
            object.__setattr__(self, 'host_checkpoints', tuple(chosen))
        for target in self.targets:
            if not isinstance(target, (ModuleTarget, RunTarget, SiblingsTarget)):
                raise ConfigError("a checkpoint plan's targets are ModuleTarget, RunTarget or "
                                  f'SiblingsTarget; got {target!r}')
        object.__setattr__(self, 'targets', list(self.targets))
        object.__setattr__(self, 'budget', parse_budget(self.budget, BUDGET_HELP))

    @property
    def activation_share(self) -> float:
        """The planned activation peak as a share of the unplanned one (both predicted)."""
        return self.planned.activation_peak / max(self.baseline.activation_peak, 1)

    def apply(self, model: nn.Module) -> AppliedPlan:
        """Checkpoint the planned modules of ``model`` in place; the handle's ``remove()``
        is :meth:`remove`.

        Raises:
            ConfigError: The plan names modules ``model`` does not have.
        """
        modules = dict(model.named_modules())
        targets = list(walk(self.targets))
        missing = [name for _, t in targets for name in t.occupies if name not in modules]
        if missing:
            raise ConfigError(f'this checkpoint plan names modules the model does not have: '
                              f'{", ".join(missing)}; plan again for this model')
        host = HostCopies(move_leaves=False) if self.inputs_on_host else None
        chosen = range(len(self.targets)) if self.host_checkpoints is None \
            else self.host_checkpoints
        copying = {id(self.targets[k]) for k in chosen}
        for depth, target in targets:
            where = HostGroup(host, id(target) in copying) \
                if host is not None and depth == 0 else None
            if isinstance(target, ModuleTarget):
                checkpoint_module(modules[target.module], target.selective, where)
            elif isinstance(target, RunTarget):
                checkpoint_run(modules[target.module], target.first, target.last,
                               target.selective, where)
            else:
                checkpoint_siblings(modules[target.parent], target.children, target.selective,
                                    where)
        count = len(targets)
        return AppliedPlan(lambda: self.remove(model),
                           f'checkpoint plan of {count} checkpoint{"" if count == 1 else "s"}'
                           f'{", " + self.host_summary if host else ""}', host)

    @property
    def host_summary(self) -> str:
        """Which checkpoints keep their inputs in host memory, as plans print it (``''``:
        none)."""
        if not self.inputs_on_host:
            return ''
        if self.host_checkpoints is None:
            return 'its inputs in host memory'
        return (f'the inputs of {len(self.host_checkpoints)} of its {len(self.targets)} in '
                'host memory')

    def with_inputs_on_host(self, chain: Chain,
                            host_capacity: float | None = None) -> CheckpointPlan | None:
        """This plan with its top-level checkpoints' inputs in host memory, those whose copies
        ``host_capacity`` bytes carry and free memory (:func:`~.cost.hosted_checkpoints`;
        ``None``: no limit), ``planned`` predicted so on ``chain`` (the step it was planned
        on); ``None`` where a checkpoint nests others (the cost model walks inner plans on the
        device), is not one of ``chain``'s segments, or where no input would move."""
        if any(target.inner for target in self.targets):
            return None
        segments = chain.segments_of(self.targets)
        if segments is None:
            return None
        segments.sort(key=lambda segment: segment.start)
        hosted = _hosting(replace(self, targets=[segment.plan_target for segment in segments],
                                  inputs_on_host=True,
                                  planned=predict(chain, segments, True, host_capacity)))
        return hosted if hosted.inputs_on_host else None

    def remove(self, model: nn.Module) -> nn.Module:
        """Undo :meth:`apply` (every checkpoint this package put on ``model``)."""
        uncheckpoint_all(model)
        return model

    def __str__(self) -> str:
        targets = list(walk(self.targets))
        count = len(targets)
        lines = [f'Checkpoint plan ({count} checkpoint{"" if count == 1 else "s"}, budget '
                 f'{"least memory" if self.budget is None else self.budget}'
                 f'{", " + self.host_summary if self.inputs_on_host else ""}):']
        for depth, target in targets:
            how = ' (selective: keeps matmul / conv / attention outputs)' \
                if target.selective else ''
            lines.append(f'  {"  " * depth}checkpoint {target.where}{how}')
        if self.baseline and self.planned:
            base, plan = self.baseline, self.planned
            share = plan.recompute_seconds / max(self.forward_seconds, 1e-9)
            lines.append(f'  predicted activation peak {mib(plan.activation_peak)} '
                         f'({self.activation_share:.2f} of '
                         f'{mib(base.activation_peak)} unplanned), recompute '
                         f'{plan.recompute_seconds:.3f} s per step ({share:.2f} of the forward '
                         f'pass); planned in {self.planning_seconds:.1f} s')
        return '\n'.join(lines)

    def to_json(self) -> dict:
        """A JSON-ready dict (:meth:`from_json` reads it back); ``targets`` in the flat list
        form of :func:`~.targets.targets_to_json`; the host memory's entries only where it is
        used (a plan that keeps none is written as earlier versions wrote it)."""
        data = {**asdict(self), 'targets': targets_to_json(self.targets)}
        for key in ('inputs_on_host', 'host_checkpoints'):
            if data[key] in (False, None):
                del data[key]
        for prediction in (data['baseline'], data['planned']):
            for key in ('host_bytes', 'host_checkpoints'):
                if prediction is not None and not prediction[key]:
                    del prediction[key]
        return data

    @classmethod
    def from_json(cls, data: dict) -> CheckpointPlan:
        """Read a dict written by :meth:`to_json` (or by an earlier version).

        A ``host_checkpoints`` count ``n`` (the first ``n`` checkpoints, as versions of
        2026-11-29 wrote it) is read as the positions ``0 .. n - 1``.

        Raises:
            ConfigError: If a target is not one this version reads.
        """
        data = dict(data)
        if 'targets' in data:
            data['targets'] = targets_from_json(data['targets'])
        if isinstance(data.get('host_checkpoints'), int):
            data['host_checkpoints'] = range(data['host_checkpoints'])
        for key in ('baseline', 'planned'):
            if data.get(key) is not None:
                prediction = dict(data[key])
                chosen = prediction.get('host_checkpoints', ())
                prediction['host_checkpoints'] = tuple(
                    range(chosen) if isinstance(chosen, int) else chosen)
                data[key] = Prediction(**prediction)
        return cls(**data)

    def save(self, path: str | Path) -> None:
        """Write the plan as JSON, whole or not at all
        (:func:`~mmdropit.common.files.atomic_write`)."""
        with atomic_write(path, 'w') as stream:
            stream.write(json.dumps(self.to_json(), indent=1))

    @classmethod
    def load(cls, path: str | Path) -> CheckpointPlan:
        """Read a plan written by :meth:`save` (or by an earlier version)."""
        return cls.from_json(json.loads(Path(path).read_text()))


class AppliedPlan(Applied):
    """A checkpoint plan in effect on a model.

    Attributes:
        host: Where its top-level checkpoints keep their inputs, and what moved
            (``host.stats``); ``None`` where they keep them on the device.
    """

    def __init__(self, remove: Callable[[], object], summary: str,
                 host: HostCopies | None) -> None:
        super().__init__(remove, summary)
        self.host = host


class _SearchSpace:
    """Segments to choose from, their additive costs, the least-memory plan among them, and
    every plan solved so far (a later search on the same chain starts from them), with the
    checkpoints' inputs in host memory or not (``inputs_on_host``, where ``host_capacity``
    bytes carry them: :func:`~.cost.hosted_checkpoints`)."""

    def __init__(self, chain: Chain, segments: list[Segment], costs: ChainCosts,
                 inputs_on_host: bool = False, host_capacity: float | None = None) -> None:
        self.chain, self.segments, self.costs = chain, segments, costs
        self.inputs_on_host, self.host_capacity = inputs_on_host, host_capacity
        self._index = {id(cost): i for i, cost in enumerate(costs.segments)}
        self.floor = least_peak(costs)
        self.least = self.segments_of(least_time(costs, self.floor))
        self.lowest = self.predict(self.least)
        self._solved = {self.floor: (self.least, self.lowest.activation_peak)}

    def segments_of(self, chosen: list[SegmentCost] | None) -> list[Segment]:
        return [self.segments[self._index[id(cost)]] for cost in chosen or []]

    def predict(self, segments: list[Segment]) -> Prediction:
        """The exact prediction of a plan of ``segments`` in this space."""
        return predict(self.chain, segments, self.inputs_on_host, self.host_capacity)

    def _solve(self, limit: int) -> tuple[list[Segment], int]:
        """The fastest plan within the additive ``limit``, and its exact activation peak."""
        if limit not in self._solved:
            plan = self.segments_of(least_time(self.costs, limit))
            self._solved[limit] = (plan, self.predict(plan).activation_peak)
        return self._solved[limit]

    def fastest_fitting(self, target: int) -> list[Segment]:
        """The fastest plan whose exact prediction fits ``target`` bytes.

        The solver works on the additive model, whose bytes differ from the exact prediction
        where storages are shared (DenseNet's features); so the additive limit is bisected
        until the exact prediction of the solver's plan fits, to within
        ``1 / 2**BISECTION_STEPS`` of the additive range, starting from the limits earlier
        searches solved."""
        top = max(self.costs.peak([]), self.floor)
        resolution = max((top - self.floor) >> BISECTION_STEPS, 1)
        low = max((limit for limit, (_, peak) in self._solved.items() if peak <= target),
                  default=self.floor)
        best = self._solved[low][0]
        high = min((limit - 1 for limit, (_, peak) in self._solved.items()
                    if peak > target and limit > low), default=top)
        while high - low > resolution:
            middle = (low + high + 1) // 2
            plan, peak = self._solve(middle)
            if peak <= target:
                best, low = plan, middle
            else:
                high = middle - 1
        return best


def _search_space(chain: Chain, nested: bool) -> _SearchSpace:
    """The search space of ``chain``'s single-level segments, or with nested ones too, built
    once per chain."""
    key = ('space', nested)
    if key not in chain.searches:
        costs = _costs(chain)
        chain.searches[key] = (_SearchSpace(chain, *with_nested(chain.segments, costs,
                                                                 chain.record.nesting_seconds))
                               if nested else _SearchSpace(chain, chain.segments, costs))
    return chain.searches[key]


def _spaces_on_host(chain: Chain,
                    host_capacity: float | None) -> tuple[_SearchSpace, ...]:
    """The single-level search spaces of plans keeping their inputs in host memory, built
    once per chain and ``host_capacity``: ``chain``'s blocks and runs of blocks
    (:func:`_over_blocks`; none for a model without repeated blocks) on the additive model of
    inputs on the host, and every segment on the device's additive model; both predicted with
    the inputs on the host, where ``host_capacity`` bytes carry them (the additive model moves
    them all: where the link carries fewer, the exact prediction's peak is higher, and the
    bisection of :meth:`_SearchSpace.fastest_fitting` goes on to a plan that fits)."""
    key = ('spaces on the host', host_capacity)
    if key not in chain.searches:
        every = _SearchSpace(chain, chain.segments, _costs(chain), True, host_capacity)
        kept = [k for k, segment in enumerate(chain.segments)
                if _over_blocks(segment, chain.blocks)]
        if not kept:
            chain.searches[key] = (every,)
        else:
            costs = _costs(chain, inputs_on_host=True)
            chain.searches[key] = (
                _SearchSpace(chain, [chain.segments[k] for k in kept],
                             replace(costs, segments=[costs.segments[k] for k in kept]),
                             True, host_capacity),
                every)
    return chain.searches[key]


def _over_blocks(segment: Segment, blocks: tuple[str, ...]) -> bool:
    """Whether ``segment`` checkpoints a block of one of the ``blocks`` sequences, or a run of
    them: the checkpoints that keep their inputs in host memory. Their inputs are the stream
    between blocks (a ViT's fp32 residual stream), a few large copies that the forward pass
    can hide; the inputs of checkpoints inside a block would move most of the activations,
    one small copy each, more than the link moves while the forward pass runs."""
    target = segment.target
    if isinstance(target, RunTarget):
        return target.module in blocks
    return isinstance(target, ModuleTarget) and target.module.rpartition('.')[0] in blocks


def _costs(chain: Chain, inputs_on_host: bool = False) -> ChainCosts:
    """The additive costs of ``chain``'s single-level segments (:func:`~.cost.chain_costs`),
    computed once per chain."""
    key = ('costs', inputs_on_host)
    if key not in chain.searches:
        chain.searches[key] = chain_costs(chain, inputs_on_host)
    return chain.searches[key]


def plan_for_chain(chain: Chain, budget: Budget = None, objective: str = 'peak',
                   nested: bool = True, inputs_on_host: bool = False,
                   host_capacity: float | None = None) -> CheckpointPlan:
    """Search the plan for a recorded chain (see :func:`plan_checkpoints`).

    Budgeted plans are searched among single-level checkpoints (plain and selective) when one
    of those fits, and among nested ones too only when none does (and ``nested`` allows them):
    nested variants multiply the search, and they pay off only where memory is tightest. With
    ``inputs_on_host`` the plan keeps its checkpoints' inputs in host memory, where
    ``host_capacity`` bytes carry them (``None``: no limit; :func:`~.cost.hosted_checkpoints`),
    and is searched, single-level, on the device
    bytes that leaves (:func:`_fastest_on_host`); a plan whose inputs all stay is a plan on the
    device (``inputs_on_host`` false).

    Raises:
        ConfigError: A budget below what any plan reaches, an unknown objective, or
            ``inputs_on_host`` with the ``'ogc'`` objective.
    """
    budget = parse_budget(budget, BUDGET_HELP)
    if objective not in OBJECTIVES:
        raise ConfigError(f'unknown checkpoint objective {objective!r}: use one of {OBJECTIVES}')
    if objective == 'ogc' and inputs_on_host:
        raise ConfigError("the 'ogc' objective plans checkpoints on the device: leave "
                          'inputs_on_host False with it')
    baseline = predict(chain, [])
    plan = CheckpointPlan(budget=budget, baseline=baseline, planned=baseline,
                          forward_seconds=chain.record.calls[0].seconds,
                          inputs_on_host=inputs_on_host)
    if not chain.segments:
        warnings.warn('no module of this model can be checkpointed (no module call that is '
                      'called once, needs a gradient and is not the last one); training runs '
                      'without a checkpoint plan', stacklevel=3)
        return plan
    if objective == 'ogc':
        ogc = {id(cost) for cost in least_ogc_cost(_costs(chain))}
        chosen = [segment for segment, cost in zip(chain.segments, _costs(chain).segments)
                  if id(cost) in ogc]
        return replace(plan, targets=[segment.plan_target for segment in chosen],
                       planned=predict(chain, chosen))
    target = resolve_budget(budget, baseline.activation_peak)
    if target is not None and baseline.activation_peak <= target:
        chosen = []
    elif inputs_on_host:
        chosen = _fastest_on_host(chain, target, budget, baseline, host_capacity)
    else:
        space = _search_space(chain, False)
        if target is None or space.lowest.activation_peak > target:
            deepest = _search_space(chain, nested)
            lowest = deepest.lowest.activation_peak
            if target is None:  # the fastest plan near the least peak
                target = lowest + lowest // LEAST_MEMORY_TOLERANCE
            if lowest > target:
                raise _below_reach(budget, lowest, baseline, nested)
            if space.lowest.activation_peak > target:
                space = deepest
        chosen = space.fastest_fitting(target)
    chosen = sorted(chosen, key=lambda segment: segment.start)
    return _hosting(replace(plan, targets=[segment.plan_target for segment in chosen],
                            planned=predict(chain, chosen, inputs_on_host, host_capacity)))


def forward_link_bytes(chain: Chain, host_link: float | None) -> float | None:
    """The bytes a host link of ``host_link`` bytes a second carries while ``chain``'s recorded
    forward pass runs (``None``: no limit), the ``host_capacity`` of a plan with its inputs in
    host memory."""
    return None if host_link is None else host_link * chain.record.calls[0].seconds


def _hosting(plan: CheckpointPlan) -> CheckpointPlan:
    """``plan`` keeping in host memory the inputs of the checkpoints its prediction moves
    (:attr:`~.cost.Prediction.host_checkpoints`): all, some, or none (then a plan on the
    device)."""
    chosen = plan.planned.host_checkpoints if plan.inputs_on_host else ()
    return replace(plan, inputs_on_host=bool(chosen),
                   host_checkpoints=chosen if 0 < len(chosen) < len(plan.targets) else None)


def _fastest_on_host(chain: Chain, target: int | None, budget: Budget,
                     baseline: Prediction, host_capacity: float | None) -> list[Segment]:
    """The plan with the least recompute, its inputs in host memory, whose predicted peak fits
    ``target`` (``None``: within :data:`LEAST_MEMORY_TOLERANCE` of the least peak), from two
    searches (:func:`_spaces_on_host`): the blocks and runs of blocks on the additive model of
    inputs on the host (a model with repeated blocks), and every single-level checkpoint on the
    device's additive model, its plans predicted with their inputs on the host (where
    ``host_capacity`` bytes carry them).
    The second finds what the first cannot reach where the blocks' inputs are a small part of
    what a plan keeps (a ResNet's), and where a budget needs a checkpoint or two inside a block.

    Raises:
        ConfigError: Neither reaches ``target``.
    """
    spaces = _spaces_on_host(chain, host_capacity)
    lowest = min(space.lowest.activation_peak for space in spaces)
    if target is None:
        target = lowest + lowest // LEAST_MEMORY_TOLERANCE
    if lowest > target:
        raise _below_reach(budget, lowest, baseline, nested=False)
    plans = [space.fastest_fitting(target) for space in spaces
             if space.lowest.activation_peak <= target]
    return min(plans, key=lambda plan: predict(chain, plan).recompute_seconds)


def _below_reach(budget: Budget, lowest: int, baseline: Prediction,
                 nested: bool) -> ConfigError:
    """The error for a budget below ``lowest``, the least peak any plan reaches."""
    return ConfigError(
        f'checkpoint budget {budget!r} is below what any '
        f'{"" if nested else "single-level "}plan reaches: the least activation peak is about '
        f'{mib(lowest)} ({lowest / max(baseline.activation_peak, 1):.2f} of the unplanned '
        f'{mib(baseline.activation_peak)}); use a budget of at least that, or budget=None for '
        'the least memory')


def plan_checkpoints(model: nn.Module, step: Callable[[], object], budget: Budget | str = None,
                     granularity: int = DEFAULT_GRANULARITY, objective: str = 'peak',
                     nested: bool = True, inputs_on_host: bool = False,
                     host_link: float | None = None) -> CheckpointPlan:
    """Record one forward pass of ``step`` and find the checkpoint plan for ``budget``.

    Args:
        model: The model to plan (not wrapped; DropIT layers, if any, already converted so that
            their compact saved bytes are what the plan counts).
        step: Runs the forward pass of a training step and returns the loss (it is not
            back-propagated). Buffers and RNG state are restored afterwards.
        budget: ``None`` for the least memory; a fraction of the unplanned activation peak such
            as ``0.5``; or a size such as ``'4GB'``.
        granularity: Module calls saving more than ``1 / granularity`` of the step's bytes are
            split into their children (finer plans, longer search).
        objective: ``'peak'`` (the predicted peak of the step, the default) or ``'ogc'``
            (Feng & Huang's objective, bytes kept plus the largest piece; ``budget`` is then
            ignored), for comparison.
        nested: Whether checkpoints may nest (a segment recomputed under a plan of its own).
            Pass ``False`` for a model that runs under ``torch.compile``: the compiled
            backward recomputes a checkpoint nested in another with the outer one, all at once,
            so a nested plan keeps no less there than its outer checkpoints alone (DeiT-S,
            batch 16: 383 MiB above the step's start compiled, 175 MiB eager; the single-level
            least-memory plan 205 MiB compiled).
        inputs_on_host: Whether the plan keeps its checkpoints' inputs in pinned host memory
            (:attr:`CheckpointPlan.inputs_on_host`; a model on a GPU, not compiled): it is
            then searched, single-level, on the device bytes that leaves, so that a budget
            takes fewer checkpoints than on the device alone (on a CPU nothing moves: the
            prediction is not what the plan keeps there).
        host_link: With ``inputs_on_host``, bytes a second between the device and pinned host
            memory (:func:`mmdropit.offload.link_bytes_per_second`): only the inputs it
            carries while the recorded forward pass runs move, those of the checkpoints in
            forward order (:attr:`CheckpointPlan.host_checkpoints`); ``None``: every
            checkpoint's (except where a copy would free nothing).

    Returns:
        The plan (not yet applied: call ``plan.apply(model)``).

    Raises:
        ConfigError: If the budget is malformed or below what any plan reaches (the message
            gives the least reachable peak).
    """
    budget = parse_budget(budget, BUDGET_HELP)
    started = time.perf_counter()
    if any(is_checkpointed(m) for m in model.modules()):
        raise ConfigError('the model already has checkpoints from a plan; call '
                          'plan.remove(model) before planning again')
    chain = build_chain(record_step(model, step), model, granularity)
    plan = plan_for_chain(chain, budget, objective, nested, inputs_on_host,
                          forward_link_bytes(chain, host_link))
    return replace(plan, planning_seconds=time.perf_counter() - started)
