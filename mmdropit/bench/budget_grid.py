"""A grid over the memory budget's knobs, to verify its search.

``MemoryBudgetHook`` predicts the peak and time of every combination of micro-batches and
checkpoint plans and measures only the one it takes. The grid measures them all: every number
of micro-batches in :data:`GRID_MICRO_BATCHES` under every plan of :data:`GRID_PLANS`, each
timed beside the baseline like any other variant. The lossy grid adds the lossy settings of
:data:`LOSSY_GRID_SETTINGS` under the same micro-batch counts, with no plan or the least-memory
one (a reduced grid: the planner's three DropIT gammas and two bit widths are one each here).
:func:`check_against_grid` then takes, for each budget the planner decided, the fastest grid
point whose measured step peak fits it (lossy points only for a lossy decision), and compares
the planner's measured time with that point's (the issue's target: within 10%).

Example::

    python tools/benchmark.py --budget --grid --models deit_small
    python tools/benchmark.py --budget --lossy-grid --models deit_small   # both grids

    >>> grid_name(4, 0.5), grid_name(2, None), grid_name(1, 'min')
    ('grid-micro4+plan-0.5', 'grid-micro2', 'grid-micro1+plan-min')
    >>> grid_name(4, 'min', 'bf16+dropit')
    'grid-bf16+dropit-micro4+plan-min'
    >>> rows = [dict(model='m', variant='budget-0.5', peak_bytes=90, time_ratio=1.2),
    ...         dict(model='m', variant='grid-micro2', peak_bytes=95, time_ratio=1.1),
    ...         dict(model='m', variant='grid-micro1+plan-min', peak_bytes=60, time_ratio=1.5)]
    >>> check, = check_against_grid(rows, {'m / 0.5-False': dict(budget_bytes=100)})
    >>> check.grid_best, round(check.time_vs_grid, 2), check.within(0.10)
    ('grid-micro2', 1.09, True)
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ..common.units import mib

GRID_MICRO_BATCHES = (1, 2, 4, 8, 16)
"""Micro-batch counts of the grid (counts above a model's batch size are skipped)."""
GRID_PLANS: tuple[float | str | None, ...] = (None, 0.7, 0.5, 0.3, 'min')
"""Checkpoint plans of the grid: none, the planner's plan at these shares of the unplanned
activation peak, and the least-memory plan."""
GRID_TOLERANCE = 0.10
"""The planner's time may exceed the grid's fastest fitting point by this share (the target)."""
GRID_POINTS = tuple((micro, plan) for micro in GRID_MICRO_BATCHES for plan in GRID_PLANS
                    if (micro, plan) != (1, None))
"""Every grid point but the baseline (one micro-batch, no plan), as (micro-batches, plan)."""


LOSSY_GRID_SETTINGS = ('bf16', 'dropit', 'bf16+dropit', 'bf16+int8')
"""Lossy settings of the lossy grid: bf16 autocast, DropIT at gamma 0.9, both, and bf16 with
what norms, GELUs and attentions save in 8 bits."""
LOSSY_GRID_PLANS: tuple[str | None, ...] = (None, 'min')
"""Checkpoint plans of the lossy grid: none, and the least-memory plan."""
LOSSY_GRID_POINTS = tuple((lossy, micro, plan) for lossy in LOSSY_GRID_SETTINGS
                          for micro in GRID_MICRO_BATCHES for plan in LOSSY_GRID_PLANS)
"""Every lossy grid point, as (lossy setting, micro-batches, plan)."""


def grid_name(micro_batches: int, plan: float | str | None, lossy: str | None = None) -> str:
    """The variant name of one grid point."""
    return (f'grid-{"" if lossy is None else lossy + "-"}micro{micro_batches}'
            + ('' if plan is None else f'+plan-{plan}'))


GRID_VARIANTS = tuple(grid_name(micro, plan) for micro, plan in GRID_POINTS)
"""The variant names of :data:`GRID_POINTS`."""
LOSSY_GRID_VARIANTS = tuple(grid_name(micro, plan, lossy)
                            for lossy, micro, plan in LOSSY_GRID_POINTS)
"""The variant names of :data:`LOSSY_GRID_POINTS`."""


@dataclass(frozen=True)
class GridCheck:
    """One budget decision of the planner beside the grid's fastest point that fits it.

    Attributes:
        model: Model name.
        planner: The planner's variant, e.g. ``'budget-0.5'``.
        budget_bytes: The budget the planner resolved.
        planner_peak_bytes: The planner's measured step peak.
        planner_time: The planner's step time, as a ratio to the baseline.
        grid_best: The fastest grid point whose measured peak fits the budget (``None``: none).
        grid_best_peak_bytes: Its measured step peak.
        grid_best_time: Its step time, as a ratio to the baseline.
        grid_fitting: How many grid points fit the budget.
    """

    model: str
    planner: str
    budget_bytes: int
    planner_peak_bytes: int
    planner_time: float
    grid_best: str | None = None
    grid_best_peak_bytes: int | None = None
    grid_best_time: float | None = None
    grid_fitting: int = 0

    @property
    def time_vs_grid(self) -> float | None:
        """The planner's time over the grid's fastest fitting point's."""
        return None if self.grid_best_time is None else self.planner_time / self.grid_best_time

    def within(self, tolerance: float = GRID_TOLERANCE) -> bool | None:
        """Whether the planner is at most ``tolerance`` slower than the grid's best (``None``
        when no grid point fits)."""
        ratio = self.time_vs_grid
        return None if ratio is None else ratio <= 1 + tolerance


def _planner_variant(key: str) -> tuple[str, str]:
    """``'deit_small / 0.5-True'`` (a budget decision's key) as ``('deit_small',
    'budget-0.5-lossy')``."""
    model, setting = key.split(' / ')
    budget, lossy = setting.rsplit('-', 1)
    return model, f'budget-{budget}' + ('-lossy' if lossy == 'True' else '')


def check_against_grid(rows: Sequence[Mapping[str, Any]],
                       decisions: Mapping[str, Mapping[str, Any]]) -> list[GridCheck]:
    """Each measured budget decision beside the grid's fastest fitting point (an exact
    decision beside exact points only, a lossy one beside both grids).

    Args:
        rows: Rows of :func:`~.report.compare` (the planner's and the grid's variants among
            them).
        decisions: The budget decisions by ``'<model> / <budget>-<lossy>'`` (their JSON,
            :meth:`~mmdropit.planner.BudgetOutcome.to_json`; ``budget_bytes`` is read).

    Returns:
        One check per decision whose planner variant was measured, in the decisions' order.
    """
    by_variant = {(row['model'], row['variant']): row for row in rows}
    checks = []
    for key, decision in decisions.items():
        model, planner = _planner_variant(key)
        row = by_variant.get((model, planner))
        if row is None or row['time_ratio'] is None:
            continue
        budget = decision['budget_bytes']
        points = (*GRID_VARIANTS, *(LOSSY_GRID_VARIANTS if planner.endswith('-lossy') else ()))
        fitting = [r for r in rows if r['model'] == model and r['variant'] in points
                   and r['time_ratio'] is not None and r['peak_bytes'] <= budget]
        best = min(fitting, key=lambda r: (r['time_ratio'], r['peak_bytes']), default=None)
        checks.append(GridCheck(
            model, planner, budget, row['peak_bytes'], row['time_ratio'],
            best and best['variant'], best and best['peak_bytes'], best and best['time_ratio'],
            len(fitting)))
    return checks


def grid_markdown(checks: Sequence[GridCheck]) -> str:
    """The checks as a markdown table."""
    lines = ['| model | planner | budget MiB | planner peak MiB | planner time | grid points '
             'fitting | grid fastest fitting | its peak MiB | its time | planner / grid | '
             f'within {GRID_TOLERANCE:.0%} |', '|---|---|---:|---:|---:|---:|---|---:|---:|---:|---|']
    for c in checks:
        best = ('none fits', '', '', '', '') if c.grid_best is None else (
            c.grid_best, mib(c.grid_best_peak_bytes, unit=False, grouped=True),
            f'{c.grid_best_time:.2f}x',
            f'{c.time_vs_grid:.2f}', 'yes' if c.within() else '**no**')
        lines.append(f'| {c.model} | {c.planner} | '
                     f'{mib(c.budget_bytes, unit=False, grouped=True)} | '
                     f'{mib(c.planner_peak_bytes, unit=False, grouped=True)} | '
                     f'{c.planner_time:.2f}x | '
                     f'{c.grid_fitting} | ' + ' | '.join(best) + ' |')
    return '\n'.join(lines) + '\n'
