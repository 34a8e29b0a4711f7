"""The memory-time frontier: every measured step as a point of (peak, time), placed against the
simple recipe.

Each point is a variant measured on one model: its step peak, its step time (in one unit for
all points of the model: the harness's median ratio to the fp32 plain step), the precision it
computes in, and whether it is ours (a plan, a budget decision, offload) or a simple baseline
(bf16, per-block checkpointing, micro-batches, ``torch.compile``). :func:`place` returns, per
point:

- its peak and time as ratios to the plain step **of the same precision** (``bf16-autocast``
  for bf16 points, the fp32 step for fp32 and lossy ones), and to the fp32 step's;
- whether another point **dominates** it (a peak as low or lower and a time as short or
  shorter, one of them strictly); a point is compared only with points at least as exact:
  fp32 with fp32, bf16 with fp32 and bf16, lossy with every point (a bf16 step does not
  dominate an exact fp32 one, a lossy budget decision may be dominated by bf16 + micro-batches);
- for each of ours, the nearest simple point (the highest peak at or below ours) that is more
  than :data:`TOLERANCE` faster: the check that no decision loses to a baseline by more than the
  noise;
- for each budget decision, the fastest point that fits its budget, and our time over its.

Example (made-up points; times as ratios to the fp32 step):

    >>> points = [Point('baseline', 100, 1.0), Point('grad-ckpt', 40, 1.3),
    ...           Point('bf16-autocast', 60, 0.5, 'bf16'),
    ...           Point('budget-0.5', 50, 1.5, ours=True, budget_bytes=50),
    ...           Point('budget-0.5+bf16', 30, 0.55, 'bf16', ours=True, budget_bytes=30)]
    >>> for p in place(points):
    ...     print(p.name, p.peak_ratio, round(p.time_ratio, 2), p.dominated_by, p.beaten_by)
    baseline 1.0 1.0 None None
    grad-ckpt 0.4 1.3 None None
    bf16-autocast 1.0 1.0 None None
    budget-0.5 0.5 1.5 grad-ckpt grad-ckpt
    budget-0.5+bf16 0.5 1.1 None None
"""
from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any

from ..common.units import mib

FP32 = 'fp32'
EXACTNESS = {'fp32': 0, 'bf16': 1, 'fp16': 1, 'lossy': 2}
"""Precisions from the most exact: a point is compared with points of this rank or lower."""
REFERENCES = {'fp32': 'baseline', 'bf16': 'bf16-autocast', 'fp16': 'fp16-autocast',
              'lossy': 'baseline'}
"""The plain step each precision's ratios divide by (a lossy setting starts from fp32)."""
TOLERANCE = 0.10
"""The noise in time: ours may be this much slower than a simple point at an equal or lower
peak (and than the fastest point that fits its budget)."""


@dataclass(frozen=True)
class Point:
    """One measured step.

    Attributes:
        name: The variant, e.g. ``'budget-0.5+bf16'``.
        peak_bytes: Its step peak.
        time: Its step time, in one unit for all points placed together (e.g. the median ratio
            to the fp32 plain step, or seconds).
        precision: A key of :data:`EXACTNESS`.
        ours: A technique of this plugin (else a simple baseline).
        budget_bytes: A budget decision's budget (``None``: not a decision); a least-memory
            decision's is the peak it reached.
    """

    name: str
    peak_bytes: int
    time: float
    precision: str = FP32
    ours: bool = False
    budget_bytes: int | None = None


@dataclass(frozen=True)
class Placed:
    """A :class:`Point` placed among the others (see the module's text).

    Attributes:
        point: The point.
        peak_ratio: Its peak over the plain step's of its precision (``None``: not measured).
        time_ratio: Its time over that step's.
        peak_vs_fp32: Its peak over the fp32 plain step's.
        time_vs_fp32: Its time over the fp32 plain step's.
        dominated_by: The nearest point that dominates it (the highest peak, then the fastest),
            ``None`` on the frontier.
        beaten_by: Ours only: the nearest simple point more than :data:`TOLERANCE` faster at an
            equal or lower peak.
        beaten_time: Our time over that point's.
        fastest_fitting: A budget decision only: the fastest other point whose peak fits its
            budget (then the lowest peak).
        vs_fastest_fitting: Our time over that point's.
    """

    point: Point
    peak_ratio: float | None = None
    time_ratio: float | None = None
    peak_vs_fp32: float | None = None
    time_vs_fp32: float | None = None
    dominated_by: str | None = None
    beaten_by: str | None = None
    beaten_time: float | None = None
    fastest_fitting: str | None = None
    vs_fastest_fitting: float | None = None

    @property
    def name(self) -> str:
        return self.point.name

    @property
    def on_frontier(self) -> bool:
        return self.dominated_by is None

    def to_json(self) -> dict[str, Any]:
        row = asdict(self)
        return dict(row.pop('point'), **row, on_frontier=self.on_frontier)


def _rank(point: Point) -> int:
    if point.precision not in EXACTNESS:
        raise ValueError(f'{point.name}: unknown precision {point.precision!r}; choose from '
                         + ', '.join(EXACTNESS))
    return EXACTNESS[point.precision]


def dominates(first: Point, second: Point) -> bool:
    """Whether ``first`` has a peak and a time no higher than ``second``'s, one strictly lower.

    Example:
        >>> dominates(Point('a', 10, 1.0), Point('b', 10, 1.2)), dominates(Point('a', 10, 1.0),
        ...                                                                 Point('b', 10, 1.0))
        (True, False)
    """
    return (first.peak_bytes <= second.peak_bytes and first.time <= second.time
            and (first.peak_bytes < second.peak_bytes or first.time < second.time))


def _nearest(points: Sequence[Point]) -> Point | None:
    """The highest peak, then the fastest."""
    return max(points, key=lambda p: (p.peak_bytes, -p.time), default=None)


def _ratio(value: float, base: float | None) -> float | None:
    return None if not base else value / base


def place(points: Sequence[Point], references: Mapping[str, str] = REFERENCES,
          tolerance: float = TOLERANCE) -> list[Placed]:
    """Each point's ratios, whether it is dominated, and for ours the checks (module text).

    Args:
        points: One model's points (names unique).
        references: The plain step's name per precision.
        tolerance: The share of time ours may lose to a simple point, or to the fastest point
            that fits its budget.

    Returns:
        One :class:`Placed` per point, in the order given.

    Raises:
        ValueError: A precision not in :data:`EXACTNESS`.

    Example (a decision slower than 4 micro-batches, which fit its budget, by 25%):

        >>> points = [Point('baseline', 100, 1.0), Point('micro-4', 45, 1.0),
        ...           Point('budget-0.5', 48, 1.25, ours=True, budget_bytes=50)]
        >>> placed = place(points)[2]
        >>> placed.beaten_by, placed.beaten_time, placed.fastest_fitting, placed.on_frontier
        ('micro-4', 1.25, 'micro-4', False)
        >>> place([Point('baseline', 100, 1.0), Point('micro-4', 45, 1.0),
        ...        Point('budget-0.5', 48, 1.05, ours=True)])[2].beaten_by is None  # the noise
        True
    """
    by_name = {point.name: point for point in points}
    fp32 = by_name.get(references.get(FP32, ''))
    placed = []
    for point in points:
        rank = _rank(point)
        arena = [other for other in points if other is not point and _rank(other) <= rank]
        reference = by_name.get(references.get(point.precision, ''))
        beaten = _nearest([other for other in arena if point.ours and not other.ours
                           and other.peak_bytes <= point.peak_bytes
                           and point.time > other.time * (1 + tolerance)])
        dominating = _nearest([other for other in arena if dominates(other, point)])
        fitting = min((other for other in arena if point.budget_bytes is not None
                       and other.peak_bytes <= point.budget_bytes),
                      key=lambda p: (p.time, p.peak_bytes), default=None)
        placed.append(Placed(
            point,
            _ratio(point.peak_bytes, reference and reference.peak_bytes),
            _ratio(point.time, reference and reference.time),
            _ratio(point.peak_bytes, fp32 and fp32.peak_bytes),
            _ratio(point.time, fp32 and fp32.time),
            dominating and dominating.name,
            beaten and beaten.name, beaten and point.time / beaten.time,
            fitting and fitting.name, fitting and point.time / fitting.time))
    return placed


def budget_variant(key: str) -> str:
    """The benchmark variant of a budget decision's key on a workload
    (:func:`~.techniques.memory_budget`).

    Example:
        >>> budget_variant('0.5-False'), budget_variant('least-True')
        ('budget-0.5', 'budget-least-lossy')
        >>> budget_variant('0.25-False-offload-bfloat16')
        'budget-0.25-offload+bf16'
        >>> budget_variant('0.5-False-bfloat16-compiled')
        'budget-0.5+compile+bf16'
    """
    budget, lossy, *rest = key.split('-')
    return (f'budget-{budget}' + ('-offload' if 'offload' in rest else '')
            + ('-lossy' if lossy == 'True' else '') + ('+compile' if 'compiled' in rest else '')
            + ('+bf16' if 'bfloat16' in rest else '+fp16' if 'float16' in rest else ''))


def frontier_points(rows: Sequence[Mapping[str, Any]], kinds: Mapping[str, tuple[str, bool]],
                    decisions: Mapping[str, Mapping[str, Any]] | None = None
                    ) -> dict[str, list[Point]]:
    """The points of each model from a run's rows.

    Args:
        rows: Rows of :func:`~.report.compare` (``time_ratio``: to the fp32 step).
        kinds: ``(precision, simple)`` by variant name; variants not in it are left out.
        decisions: Budget decisions' JSON by ``'<model> / <key>'`` (``budget_bytes`` is read).

    Example:
        >>> rows = [dict(model='m', variant='baseline', peak_bytes=10, time_ratio=1.0),
        ...         dict(model='m', variant='budget-0.5', peak_bytes=5, time_ratio=1.2)]
        >>> frontier_points(rows, {'baseline': ('fp32', True), 'budget-0.5': ('fp32', False)},
        ...                 {'m / 0.5-False': dict(budget_bytes=6)})['m'][1]
        ... # doctest: +NORMALIZE_WHITESPACE
        Point(name='budget-0.5', peak_bytes=5, time=1.2, precision='fp32', ours=True,
              budget_bytes=6)
    """
    budgets = {}
    for key, decision in (decisions or {}).items():
        model, setting = key.split(' / ')
        budgets[model, budget_variant(setting)] = decision['budget_bytes']
    points: dict[str, list[Point]] = {}
    for row in rows:
        if row['variant'] not in kinds or row['time_ratio'] is None:
            continue
        precision, simple = kinds[row['variant']]
        points.setdefault(row['model'], []).append(Point(
            row['variant'], row['peak_bytes'], row['time_ratio'], precision, not simple,
            budgets.get((row['model'], row['variant']))))
    return points


def _times(value: float | None) -> str:
    return 'n/a' if value is None else f'{value:.2f}'


def frontier_markdown(placed: Sequence[Placed], tolerance: float = TOLERANCE) -> str:
    """One model's points as a markdown table, then the checks of ours in a few lines.

    Example:
        >>> table = frontier_markdown(place([Point('baseline', 2**20, 1.0),
        ...                                  Point('grad-ckpt', 2**19, 1.3)]))
        >>> print(table.splitlines()[3])
        | grad-ckpt | fp32 | simple | 0.5 | 0.50 | 0.50 | 1.30 | 1.30 | frontier |  |  |
    """
    lines = ['| point | precision | kind | peak MiB | peak (x plain) | peak (x fp32) | '
             'time (x plain) | time (x fp32) | dominated by | ours: a simple point '
             f'>{tolerance:.0%} faster at <= peak | budget: fastest fitting point |',
             '|---|---|---|---:|---:|---:|---:|---:|---|---|---|']
    for p in placed:
        beaten = '' if p.beaten_by is None else f'**{p.beaten_by}** ({p.beaten_time:.2f}x)'
        fitting = '' if p.fastest_fitting is None else \
            f'{p.fastest_fitting} ({p.vs_fastest_fitting:.2f}x)'
        cells = [p.name, p.point.precision, 'ours' if p.point.ours else 'simple',
                 mib(p.point.peak_bytes, unit=False, grouped=True), _times(p.peak_ratio),
                 _times(p.peak_vs_fp32), _times(p.time_ratio), _times(p.time_vs_fp32),
                 p.dominated_by or 'frontier', beaten, fitting]
        lines.append('| ' + ' | '.join(cells) + ' |')
    beaten = [p for p in placed if p.beaten_by is not None]
    slow = [p for p in placed if p.vs_fastest_fitting is not None
            and p.vs_fastest_fitting > 1 + tolerance]
    lines += ['', f'- ours beaten by a simple point by more than {tolerance:.0%} in time at an '
              'equal or lower peak: ' + (', '.join(
                  f'{p.name} (by {p.beaten_by}, {p.beaten_time:.2f}x)' for p in beaten) or 'none'),
              f'- budget decisions more than {tolerance:.0%} slower than the fastest point that '
              'fits their budget: ' + (', '.join(
                  f'{p.name} ({p.vs_fastest_fitting:.2f}x {p.fastest_fitting})' for p in slow)
                  or 'none')]
    return '\n'.join(lines) + '\n'


def frontier_section(placed: Mapping[str, Sequence[Placed]],
                     tolerance: float = TOLERANCE) -> str:
    """The frontier of every model, as the markdown a run's ``benchmark.md`` ends with."""
    text = ('\n## Frontier: peak against time\n\nEach point\'s peak and time as ratios to the '
            'plain step of its precision (*x plain*: the fp32 step for fp32 and lossy points, '
            '`bf16-autocast` for bf16 ones) and to the fp32 step\'s. *dominated by*: the nearest '
            'point with a peak and a time no higher, one lower, among those at least as exact '
            '(fp32 < bf16 < lossy); *frontier*: none. For each of ours, the nearest simple point '
            f'more than {tolerance:.0%} faster at an equal or lower peak, and for each budget '
            'decision the fastest other point whose peak fits its budget (its time over that '
            'point\'s). Plot: `frontier.png`.\n')
    return text + ''.join(f'\n### {model}\n\n' + frontier_markdown(rows, tolerance)
                          for model, rows in placed.items())
