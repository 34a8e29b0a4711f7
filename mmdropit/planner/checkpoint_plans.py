"""The checkpoint plans a memory budget offers (:class:`CheckpointPlans`): for what the techniques
before it leave, the fastest searched plan that fits, and per-block checkpointing of the model's
repeated blocks beside it; on a GPU, where asked for, also the fastest plan that fits with its
checkpoints' inputs kept in host memory, and per-block checkpointing so.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass, replace

from torch import nn

from ..checkpoint import CheckpointPlan, per_block_plan, plan_for_chain, uncheckpoint_all
from ..checkpoint.chain import Chain
from ..errors import ConfigError
from .estimate import Choice, Estimate
from .techniques import Target, Technique


@dataclass(frozen=True)
class _SearchedPlan:
    """A plan, and the shares of the unplanned activations it is the answer for: from the
    share it reaches (0 for the least-memory plan given to shares no plan reaches) to the
    share it was searched for."""

    low: float
    high: float
    plan: CheckpointPlan


FORWARD_SHARE = 1 / 3
"""The forward pass's share of a training step's time, behind which the copies of checkpoint
inputs kept in host memory travel: the part of their time beyond it is predicted to add to the
step's (the shortlist measures it)."""


class CheckpointPlans(Technique):
    """The fastest checkpoint plan whose predicted activations fit what the budget leaves.

    The cost model's activation peak is relative: a plan predicted at a share ``r`` of the
    recorded step's activation peak is predicted to leave ``r`` of the estimate's activations,
    counted at their exact size: what a plan keeps is mostly the tensors at its checkpoints'
    boundaries (a transformer's fp32 residual stream), which lossy techniques leave as they are
    (bf16 autocast keeps the residuals in fp32, DropIT and quantized activations compress what
    the layers inside save), so their saving is not multiplied with the plan's (see
    :attr:`~.estimate.Estimate.lossy`). The lossy settings' constant bytes are still counted,
    though the plan may free some of them (:attr:`~.estimate.Estimate.freeable_bytes`). Its
    recompute time adds ``recompute_seconds / step_seconds`` to the time ratio, times the lossy
    settings' time ratio (the recomputed forward runs under them: bf16 halves it on this CPU).

    With ``host_link``, plans are also offered with their checkpoints' inputs in host memory
    (:attr:`~mmdropit.checkpoint.CheckpointPlan.inputs_on_host`): the fastest one searched so
    (single-level; :func:`~mmdropit.checkpoint.plan_for_chain`), and the per-block plan, each
    moving the inputs of its checkpoints in forward order, as far as the link carries them in
    :data:`FORWARD_SHARE` of the step with nothing applied, except where a copy would free
    nothing (:func:`~mmdropit.checkpoint.cost.hosted_checkpoints`; the others keep theirs on
    the device). Their activations as the cost model predicts the device's, their time that of the
    plan plus the copies' time beyond :data:`FORWARD_SHARE` of the step's (a step's copies each
    way: the inputs' share of the activations, of every micro-batch, at ``host_link`` bytes a
    second).

    Args:
        record: Records the step, or a part of its batch
            (:func:`~mmdropit.checkpoint.chain.build_chain`); called once, when plans are first
            searched.
        step_seconds: The measured time of the forward and backward pass of what ``record``
            records (called by need, like ``record``): recompute time is a share of it.
        model: The recorded model (its repeated blocks make the per-block plan).
        nested: Whether searched plans may nest checkpoints (``False`` for a step that runs
            under ``torch.compile``: see :func:`~mmdropit.checkpoint.plan_checkpoints`).
        host_link: Bytes a second between the device and pinned host memory
            (:func:`~mmdropit.offload.link_bytes_per_second`) where plans may keep their
            inputs in host memory; ``None``: they may not.
        whole_seconds: The measured time of the whole batch's pass with nothing applied (the
            unit of the time ratios; called when a plan with inputs in host memory is
            offered).
        recorded_share: The share of the whole batch that ``record`` records (called when a
            plan with inputs in host memory is first searched: the bytes the link carries in
            the whole batch's forward pass, scaled to the recorded step's; ``None``: all of
            it).
    """

    name = 'checkpoint-plan'
    slows_only = True

    def __init__(self, record: Callable[[], Chain], step_seconds: Callable[[], float],
                 model: nn.Module, nested: bool = True, host_link: float | None = None,
                 whole_seconds: Callable[[], float] | None = None,
                 recorded_share: Callable[[], float] | None = None) -> None:
        self._record = record
        self.step_seconds = step_seconds
        self._model = model
        self.nested = nested
        if host_link is not None and whole_seconds is None:
            raise ValueError('CheckpointPlans: a host_link needs the whole_seconds it is weighed '
                             'against')
        self.host_link, self.whole_seconds = host_link, whole_seconds
        self.recorded_share = recorded_share
        self._plans: dict[bool, list[_SearchedPlan]] = {False: [], True: []}
        self._least_plans: dict[bool, CheckpointPlan] = {}
        self._texts: dict[str, tuple] = {}

    @functools.cached_property
    def host_capacity(self) -> float | None:
        """The bytes of the recorded step whose copies the link carries in
        :data:`FORWARD_SHARE` of the whole batch's step with nothing applied (``None`` where
        nothing moves; worked out once, so that every search weighs the same). A faster
        combination (bf16) hides less behind its shorter forward pass: :meth:`_hosted` charges
        it the copies' time beyond that."""
        if self.host_link is None:
            return None
        share = self.recorded_share() if self.recorded_share else 1.0
        return self.host_link * FORWARD_SHARE * self.whole_seconds() * share

    @functools.cached_property
    def chain(self) -> Chain:
        """The recorded step (recorded on first use)."""
        return self._record()

    def _plan(self, share: float, inputs_on_host: bool = False) -> CheckpointPlan:
        """The fastest plan within ``share`` of the unplanned activations (its inputs in host
        memory or not), or the least-memory plan when no plan reaches that share. Shares are
        rounded down to 1/256, and a plan searched for a larger share that also fits this one
        is that share's plan too (the fastest among more plans is the fastest among fewer that
        hold it), so near-equal searches are made once."""
        share = math.floor(share * 256) / 256
        plans = self._plans[inputs_on_host]
        for searched in plans:
            if searched.low <= share <= searched.high:
                return searched.plan
        try:
            plan = (plan_for_chain(self.chain, budget=share, nested=self.nested,
                                   inputs_on_host=inputs_on_host,
                                   host_capacity=self._capacity(inputs_on_host))
                    if share > 0 else None)
        except ConfigError:  # below what any plan reaches
            plan = None
        if plan is None:  # so is every smaller share
            plans.append(_SearchedPlan(0.0, share, self._least(inputs_on_host)))
            return self._least(inputs_on_host)
        plans.append(_SearchedPlan(plan.activation_share, share, plan))
        return plan

    def _least(self, inputs_on_host: bool) -> CheckpointPlan:
        if inputs_on_host not in self._least_plans:
            self._least_plans[inputs_on_host] = plan_for_chain(
                self.chain, budget=None, nested=self.nested, inputs_on_host=inputs_on_host,
                host_capacity=self._capacity(inputs_on_host))
        return self._least_plans[inputs_on_host]

    def _capacity(self, inputs_on_host: bool) -> float | None:
        return self.host_capacity if inputs_on_host else None

    @functools.cached_property
    def per_block(self) -> CheckpointPlan | None:
        """The per-block plan of the recorded model
        (:func:`~mmdropit.checkpoint.per_block_plan`; ``None`` when it has no repeated
        blocks), offered beside the searched plan so that the search's choice is measured
        against it; a searched plan with the same checkpoints (in any order) is offered as
        this one, under its name."""
        return per_block_plan(self.chain, self._model)

    @functools.cached_property
    def _per_block_on_host(self) -> CheckpointPlan | None:
        """:attr:`per_block` with its inputs in host memory (those :attr:`host_capacity`
        carries), predicted once (``None``: none would move)."""
        block = self.per_block
        return block.with_inputs_on_host(self.chain, self.host_capacity) if block else None

    def candidates(self, estimate: Estimate, budget_bytes: int) -> Iterator[Estimate]:
        yield estimate
        if estimate.peak_bytes <= budget_bytes or not estimate.activation_bytes:
            return
        exact = estimate.activation_bytes / estimate.lossy.activation_ratio
        share = (budget_bytes - estimate.fixed_bytes) / exact
        for on_host in (False, True) if self.host_link is not None else (False,):
            for offer, text in self._offered(share, on_host):
                where = f', {offer.host_summary}' if on_host else ''
                text = self._distinct(
                    f'{text}{where}, {offer.activation_share:.2f} of the activations)', offer)
                yield (self._hosted(estimate, offer, text) if on_host
                       else self._planned(estimate, offer, text))

    def _offered(self, share: float,
                 inputs_on_host: bool) -> Iterator[tuple[CheckpointPlan, str]]:
        """The searched plan for ``share`` and the per-block plan (once where they are the
        same), their inputs in host memory or not, each with the start of its text."""
        plan = self._plan(share, inputs_on_host)
        block = self._per_block_on_host if inputs_on_host else self.per_block
        if plan.targets and plan.inputs_on_host == inputs_on_host and (
                block is None or set(plan.targets) != set(block.targets)):
            count = len(plan.targets)
            yield plan, f'checkpoint plan ({count} top-level checkpoint' \
                        f'{"" if count == 1 else "s"}'
        if block is not None:
            yield block, f'per-block checkpointing ({len(block.targets)} blocks'

    def _distinct(self, text: str, plan: CheckpointPlan) -> str:
        """``text``, or, where another plan offered before reads the same, ``text`` with
        ``' #2'``, ``' #3'``, ... added: summaries key the measured peaks and times of a
        decision, across its searches (each retry searches another share, and two plans of as
        many checkpoints can keep the same share to two decimals)."""
        key = (frozenset(plan.targets), plan.inputs_on_host, plan.host_checkpoints)
        named, count = text, 1
        while self._texts.setdefault(named, key) != key:
            count += 1
            named = f'{text} #{count}'
        return named

    def _planned(self, estimate: Estimate, plan: CheckpointPlan, text: str) -> Estimate:
        """``estimate`` with ``plan``: its share of the exact activations kept, its recompute
        time added (see the class)."""
        exact = estimate.activation_bytes / estimate.lossy.activation_ratio
        recompute = plan.planned.recompute_seconds / max(self.step_seconds(), 1e-9)
        planned = estimate.choose(Choice(self.name, plan, text),
                                  int(min(estimate.activation_bytes,
                                          exact * plan.activation_share)),
                                  estimate.time_ratio + recompute * estimate.lossy.time_ratio)
        return replace(planned, freeable_bytes=estimate.lossy.constant_bytes)

    def _hosted(self, estimate: Estimate, plan: CheckpointPlan, text: str) -> Estimate:
        """:meth:`_planned` for a plan with its inputs in host memory, the copies' time beyond
        :data:`FORWARD_SHARE` of the step's added (see the class)."""
        planned = self._planned(estimate, plan, text)
        exact = estimate.activation_bytes / estimate.lossy.activation_ratio
        moved = (exact * plan.planned.host_bytes / max(plan.baseline.activation_peak, 1)
                 * int(estimate.setting('micro-batches', 1)))
        unit = max(self.whole_seconds(), 1e-9)
        exposed = max(moved / self.host_link - FORWARD_SHARE * estimate.time_ratio * unit, 0.0)
        return replace(planned, time_ratio=planned.time_ratio + exposed / unit)

    def apply(self, setting: object, target: Target) -> None:
        setting.apply(target.model)

    def remove(self, target: Target) -> None:
        uncheckpoint_all(target.model)

    def encode(self, setting: object) -> object:
        return setting.to_json()

    def decode(self, value: object) -> object:
        """The saved plan.

        Raises:
            ConfigError: If ``value`` is not a plan's dict.
        """
        if not isinstance(value, dict):
            raise ConfigError(f'a checkpoint plan is saved as a dict, not {value!r}')
        return CheckpointPlan.from_json(value)
