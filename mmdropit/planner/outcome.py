"""What a memory budget's planning measured and decided (:class:`BudgetOutcome`), and its
decision as JSON (``memory_plan.json``): each technique encodes its own setting
(:func:`encode_choices`, read back by :func:`decode_choices`).

Example:
    >>> from .techniques import MicroBatches
    >>> micro = MicroBatches(8, seconds_of=lambda size: 1.0 + size)
    >>> rows = [dict(technique='micro-batches', setting=4, text='4 micro-batches of at most 2')]
    >>> decode_choices(rows, [micro])
    (Choice(technique='micro-batches', setting=4, text='4 micro-batches of at most 2'),)
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from ..common.units import mib
from ..errors import ConfigError
from .decision import Decision
from .estimate import Choice, Estimate
from .techniques import Technique


@dataclass
class BudgetOutcome:
    """What :func:`~.budget.plan_within_budget` measured and decided.

    Attributes:
        decision: The decision (its combination is in effect).
        techniques: The techniques it chose among (to apply or remove the decision again).
        unplanned_peak: The measured step peak with nothing applied (the parameters hold no
            gradient when it starts, unless gradients accumulate over batches); predicted
            where the batch ran out of memory (``unplanned_predicted_from``).
        fixed_bytes: Parameters, gradients, buffers and optimizer state.
        seconds: Time spent measuring, searching and proving the decision.
        reused: Whether the decision is a saved one (an earlier run's, or this run's made again on
            a larger batch of its bucket), measured again and kept.
        least: Whether the budget was the least peak the techniques reach (the decision's
            budget is then that measured peak).
        max_slowdown: With ``least``, the most measured time a combination could take, as a
            multiple of the plain step's (``None``: no bound).
        unused_saved: Why an earlier run's decision, given, was not read (``''``: none was
            given, or it was read).
        unplanned_predicted_from: The samples ``unplanned_peak`` was predicted from, the
            whole batch having run out of memory with nothing applied (0: measured on the
            whole batch); the plain step's time, the unit of the time ratios, was then
            predicted from the largest part that runs.
    """

    decision: Decision
    techniques: list[Technique] = field(default_factory=list)
    unplanned_peak: int = 0
    fixed_bytes: int = 0
    seconds: float = 0.0
    reused: bool = False
    least: bool = False
    max_slowdown: float | None = None
    unused_saved: str = ''
    unplanned_predicted_from: int = 0

    def to_json(self) -> dict:
        """The decision as JSON: what :func:`~.budget.plan_within_budget` reads back as
        ``saved``, and the figures and table behind it."""
        chosen = self.decision.chosen
        return dict(budget_bytes=self.decision.budget_bytes,
                    unplanned_peak_bytes=self.unplanned_peak,
                    unplanned_predicted_from=self.unplanned_predicted_from,
                    fixed_bytes=self.fixed_bytes,
                    measured_peak_bytes=self.decision.measured_bytes,
                    predicted_peak_bytes=chosen.peak_bytes,
                    predicted_time_ratio=chosen.time_ratio, chosen=chosen.summary,
                    choices=encode_choices(chosen, self.techniques),
                    decided_seconds=self.seconds, reused=self.reused,
                    table=self.decision.table().splitlines())

    def __str__(self) -> str:
        decision = self.decision
        budget = (least_text(self.max_slowdown) if self.least
                  else f'budget {mib(decision.budget_bytes)}')
        if self.reused:
            return (f'{budget}; the saved decision '
                    f'{decision.chosen.summary} is kept: measured peak '
                    f'{mib(decision.measured_bytes)}')
        predicted = self.unplanned_predicted_from
        how = (f'; the whole batch ran out of memory: its peak is predicted from {predicted} '
               'sample(s), its time (the unit of the time ratios) from the largest part that '
               'runs' if predicted else '')
        return (f'{budget} (step peak with nothing applied {mib(self.unplanned_peak)}, of '
                f'which parameters, gradients, buffers and optimizer state '
                f'{mib(self.fixed_bytes)}{how}); chosen: '
                f'{decision.chosen.summary}, measured peak {mib(decision.measured_bytes)}; '
                f'decided in {self.seconds:.1f} s\n{decision.table()}')


def least_text(max_slowdown: float | None) -> str:
    """What a decision without a budget reached, e.g. ``'the least peak the techniques reach
    within 2.0x the plain step\'s time'``."""
    return 'the least peak the techniques reach' + (
        '' if max_slowdown is None
        else f' within {max_slowdown:.1f}x the plain step\'s time')


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
