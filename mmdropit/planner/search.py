"""Combine techniques under one memory budget: predict every combination, take the fastest that
fits with a margin, measure it, and tighten when the measurement does not fit.

Example:
    >>> from .techniques import MicroBatches
    >>> micro = MicroBatches(16, seconds_of=lambda size: 0.1 + size)
    >>> decision = decide(Estimate(200, 1600), [micro], budget_bytes=700,
    ...                   measure=lambda estimate: estimate.peak_bytes + 20)
    >>> decision.chosen.summary, decision.measured_bytes
    ('4 micro-batches of at most 4', 620)
    >>> print(decision.table().splitlines()[0])
    | combination | predicted peak MiB | measured peak MiB | predicted time | chosen |
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..errors import ConfigError
from .estimate import Estimate
from .techniques import Target, Technique

MARGIN = 0.05
"""A combination is chosen only if its predicted peak is at most ``1 - MARGIN`` of the budget."""

ATTEMPTS = 3
"""Measured combinations that did not fit before the search gives up."""

MIB = 2**20

LOWER = 'sharding the model state with FSDP over several processes'
"""What goes lower than every technique here, for the error message of a budget none reaches."""


def combinations(start: Estimate, techniques: Sequence[Technique],
                 budget_bytes: int) -> list[Estimate]:
    """Every combination of the techniques' candidates, each technique applied on top of the
    ones before it (in the order given)."""
    frontier = [start]
    for technique in techniques:
        frontier = [after for before in frontier
                    for after in technique.candidates(before, budget_bytes)]
    return frontier


@dataclass
class Decision:
    """The combination chosen for a budget, and every one considered.

    Attributes:
        budget_bytes: The budget.
        chosen: The combination trained with.
        measured_bytes: Its measured peak.
        considered: Every combination predicted, in the last search.
        measured: Measured peaks by combination summary (those measured that did not fit, and
            the chosen one).
    """

    budget_bytes: int
    chosen: Estimate
    measured_bytes: int
    considered: list[Estimate] = field(default_factory=list)
    measured: dict[str, int] = field(default_factory=dict)

    def table(self) -> str:
        """The decision table: every combination, its predicted and measured peak, its
        predicted time, and which was chosen."""
        lines = ['| combination | predicted peak MiB | measured peak MiB | predicted time '
                 '| chosen |', '|---|---:|---:|---:|---|']
        for estimate in sorted(self.considered, key=lambda e: (e.time_ratio, e.peak_bytes)):
            measured = self.measured.get(estimate.summary)
            lines.append(
                f'| {estimate.summary} | {estimate.peak_bytes / MIB:.1f} | '
                f'{"" if measured is None else f"{measured / MIB:.1f}"} | '
                f'{estimate.time_ratio:.2f}x | {"<-" if estimate is self.chosen else ""} |')
        return '\n'.join(lines)


def remove_all(techniques: Sequence[Technique], target: Target) -> None:
    """Remove every technique from ``target``, the last applied first."""
    for technique in reversed(techniques):
        technique.remove(target)


def put_in_effect(estimate: Estimate, techniques: Sequence[Technique], target: Target) -> None:
    """Remove every technique from ``target``, then apply the settings ``estimate`` chose."""
    remove_all(techniques, target)
    by_name = {technique.name: technique for technique in techniques}
    for choice in estimate.choices:
        by_name[choice.technique].apply(choice.setting, target)


def fastest_fitting(considered: Sequence[Estimate], limit: int,
                    correction: float = 1.0) -> Estimate | None:
    """The fastest estimate whose predicted peak, its activations multiplied by
    ``correction``, is at most ``limit`` (the lower peak among equally fast ones); ``None``
    when none fits."""
    fitting = [estimate for estimate in considered
               if estimate.fixed_bytes + estimate.activation_bytes * correction <= limit]
    return min(fitting, key=lambda e: (e.time_ratio, e.peak_bytes), default=None)


def decide(start: Estimate, techniques: Sequence[Technique], budget_bytes: int,
           measure: Callable[[Estimate], int],
           lower: str = LOWER) -> Decision:
    """The fastest combination whose predicted peak fits ``budget_bytes`` with
    :data:`MARGIN` and whose measured peak fits it. When a measured peak does not fit, its
    activations measured some factor above their prediction (the state's bytes are known): all
    predicted activations are taken to be that short, and the search runs again.

    Args:
        start: The step without any technique, as measured.
        techniques: The techniques to combine, in the order they are applied.
        budget_bytes: The budget for the whole step's peak.
        measure: Applies a combination and returns its measured peak (it stays applied).
        lower: What would go lower than these techniques, for the error message.

    Returns:
        The decision; the chosen combination is applied.

    Raises:
        ConfigError: No combination is predicted to fit (the message gives the least predicted
            peak), or the measured ones did not fit and, corrected by their overshoot, no
            other is predicted to (at most :data:`ATTEMPTS` are measured).
    """
    limit, correction = int(budget_bytes * (1 - MARGIN)), 1.0
    measured: dict[str, int] = {}
    for _ in range(ATTEMPTS):
        # techniques size their settings (a plan's share) for predictions corrected so far
        sized_for = start.fixed_bytes + int((limit - start.fixed_bytes) / correction)
        considered = combinations(start, techniques, sized_for)
        chosen = fastest_fitting(considered, limit, correction)
        if chosen is None and measured:
            break  # no corrected prediction fits
        if chosen is None:
            least = min(considered, key=lambda e: e.peak_bytes)
            raise ConfigError(
                f'memory budget {budget_bytes / MIB:.1f} MiB is below what these techniques reach: '
                f'the least predicted step peak is {least.peak_bytes / MIB:.1f} MiB '
                f'({least.summary}; parameters, gradients and optimizer state alone are '
                f'{start.fixed_bytes / MIB:.1f} MiB); raise the budget, or go lower with {lower}')
        peak = measure(chosen)
        measured[chosen.summary] = peak
        if peak <= budget_bytes:
            return Decision(budget_bytes, chosen, peak, considered, measured)
        # the chosen combination's activations measured `short` times their prediction (the
        # state's bytes are known): predictions are taken to be that short from now on
        short = (peak - chosen.fixed_bytes) / max(chosen.activation_bytes, 1)
        correction = max(correction, short)
    raise ConfigError(
        f'memory budget {budget_bytes / MIB:.1f} MiB: the combinations predicted to fit measured '
        f'above it ({", ".join(f"{k}: {v / MIB:.1f} MiB" for k, v in measured.items())}) and no '
        f'other is predicted to fit after correcting for that; raise the budget, or go lower '
        f'with {lower}')
