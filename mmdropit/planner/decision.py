"""The combination a search chose for a memory budget, and the table of every one it considered
(:class:`Decision`).

Example:
    >>> from .estimate import Choice, Estimate
    >>> halves = Estimate(100, 2**20).choose(Choice('micro-batches', 2, '2 micro-batches'),
    ...                                      2**19, 1.1)
    >>> decision = Decision(2**20, halves, 2**19 + 200, [halves], {halves.summary: 2**19 + 200})
    >>> print(decision.table().splitlines()[-1])
    | 2 micro-batches | 0.5 | 0.5 | 1.10x |  | <- |
"""
from __future__ import annotations

from dataclasses import dataclass, field

from ..common.units import mib
from .estimate import Estimate


@dataclass
class Decision:
    """The combination chosen for a budget, and every one considered.

    Attributes:
        budget_bytes: The budget.
        chosen: The combination trained with.
        measured_bytes: Its measured peak.
        considered: Every combination predicted, in the last search (and the exact ones a
            lossy choice was checked against).
        measured: Measured peaks by combination summary: every combination measured (the
            chosen one, those that did not fit, an exact one a lossy choice was checked
            against).
        timed: Measured step times (ratios to the step without techniques) by combination
            summary: a lossy choice and the exact combination it was checked against.
        out_of_memory: The summaries of the measured combinations whose last pass ran out of
            memory (their ``measured`` peak is the search's stand-in: twice the budget).
    """

    budget_bytes: int
    chosen: Estimate
    measured_bytes: int
    considered: list[Estimate] = field(default_factory=list)
    measured: dict[str, int] = field(default_factory=dict)
    timed: dict[str, float] = field(default_factory=dict)
    out_of_memory: set[str] = field(default_factory=set)

    def table(self) -> str:
        """The decision table: every combination, its predicted and measured peak, its
        predicted and measured time, and which was chosen."""
        lines = ['| combination | predicted peak MiB | measured peak MiB | predicted time '
                 '| measured time | chosen |', '|---|---:|---:|---:|---:|---|']
        for estimate in sorted(self.considered, key=lambda e: (e.time_ratio, e.peak_bytes)):
            measured = self.measured.get(estimate.summary)
            timed = self.timed.get(estimate.summary)
            shown = ('out of memory' if estimate.summary in self.out_of_memory
                     else '' if measured is None else mib(measured, unit=False))
            lines.append(
                f'| {estimate.summary} | {mib(estimate.peak_bytes, unit=False)} | {shown} | '
                f'{estimate.time_ratio:.2f}x | {"" if timed is None else f"{timed:.2f}x"} | '
                f'{"<-" if estimate.summary == self.chosen.summary else ""} |')
        return '\n'.join(lines)
