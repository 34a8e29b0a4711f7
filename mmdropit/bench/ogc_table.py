"""Our checkpoint plans on every model of the OGC paper's table, beside the paper's figures.

Per row of :data:`~.ogc_models.OGC_ROWS`, four variants are measured side by side (the usual
harness: saved bytes, step peak by category, alternated step times): the baseline, our
least-memory plan (``ckpt-plan-min``), our fastest plan predicted to fit the paper's memory cut
(``ckpt-at-paper-cut``: a budget of ``1 - cut`` of the unplanned activation peak) and the paper's
own objective (bytes kept plus the largest recomputed piece, single-level plain checkpoints)
solved by our solver on the same machine (``ckpt-ogc``): the paper's method where its GPU
figures cannot be compared directly. Rows whose architecture is the same (the cell-based
stand-ins) are measured once.

Two memory cuts are reported, because the paper's is neither of ours exactly:

- *activation cut*: 1 - the plan's activation peak / the baseline's (parameters, gradients and
  optimizer state left out), at our batch;
- *forward-backward cut*: the same with the parameters and their gradients added to both peaks,
  as the paper's loop holds them (it never clears gradients) and its allocator peak counts them;
  at our smaller batch they weigh more than at the paper's, so this cut is lower than the paper's
  method would show at its batch.

The paper's cut lies between the two at its batch. Example::

    results = run_ogc_table(['resnet50'], scale=8, steps=3, device=torch.device('cpu'))
    print(ogc_markdown(results))
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from ..reporting import provenance
from .harness import benchmark_workload
from .ogc_models import OGC_ROWS, OGCRow, ogc_workload
from .report import Measurement, compare
from .techniques import checkpoint_plan, plan_key
from .variants import BASELINE, Variant

LEAST_MEMORY = 'ckpt-plan-min'
AT_PAPER_CUT = 'ckpt-at-paper-cut'
PAPER_OBJECTIVE = 'ckpt-ogc'
PLANS = (LEAST_MEMORY, AT_PAPER_CUT, PAPER_OBJECTIVE)
_NAMES = {LEAST_MEMORY: 'least memory', AT_PAPER_CUT: 'at the cut',
          PAPER_OBJECTIVE: "paper's objective"}


@dataclass(frozen=True)
class PlanPoint:
    """One of our plans on one row, as ratios to the row's baseline.

    Attributes:
        variant: One of :data:`PLANS`.
        activation_cut: 1 - activation peak / the baseline's.
        forward_backward_cut: 1 - (parameters + gradients + activation peak) / the baseline's.
        time_overhead: Step time ratio - 1 (median of alternated rounds).
        planning_seconds: Recording and search time of the plan.
    """

    variant: str
    activation_cut: float
    forward_backward_cut: float
    time_overhead: float
    planning_seconds: float


@dataclass(frozen=True)
class OGCResult:
    """What was measured for one row of the paper's table.

    Attributes:
        row: The paper's row.
        batch_size: Our batch size.
        measurements: The baseline's and each plan's measurement.
        points: Our plans as ratios, :data:`PLANS` order.
    """

    row: OGCRow
    batch_size: int
    measurements: tuple[Measurement, ...]
    points: tuple[PlanPoint, ...]

    def dominating(self, noise: float = 0.0) -> list[str]:
        """Our plans that cut at least the paper's share at no more overhead (plus ``noise``)
        than the paper reports."""
        return [point.variant for point in self.points if point.variant != PAPER_OBJECTIVE
                and point.activation_cut >= self.row.memory_cut
                and point.time_overhead <= self.row.time_overhead + noise]


def _points(work_measurements: list[Measurement], static_bytes: int,
            planning: dict[str, float]) -> tuple[PlanPoint, ...]:
    rows = {row['variant']: row for row in compare(work_measurements, BASELINE)}
    base = rows[BASELINE]['activation_peak_bytes']
    points = []
    for variant in PLANS:
        if variant not in rows:
            continue
        activation = rows[variant]['activation_peak_bytes']
        points.append(PlanPoint(
            variant, 1 - activation / base,
            1 - (static_bytes + activation) / (static_bytes + base),
            rows[variant]['time_ratio'] - 1, planning.get(variant, 0.0)))
    return tuple(points)


def run_ogc_table(names: Sequence[str], scale: int, steps: int, device: torch.device,
                  seed: int = 0) -> list[OGCResult]:
    """Measure the baseline and our two plans on each named row.

    Args:
        names: Row names from :data:`OGC_ROWS`.
        scale: The paper's batch sizes are divided by it (CPU time).
        steps: Timed rounds per row.
        device: Where the models run.
        seed: Seeds torch before each model is built.

    Returns:
        One result per name, in order.
    """
    measured: dict[tuple[str, int, int],
                   tuple[tuple[Measurement, ...], tuple[PlanPoint, ...]]] = {}
    results = []
    for name in names:
        row = OGC_ROWS[name]
        batch_size = max(1, row.batch_size // scale)
        key = (row.builder, batch_size, row.our_image_size or row.image_size)
        if key not in measured:
            torch.manual_seed(seed)
            work = ogc_workload(row, scale, device)
            variants = [Variant(BASELINE), Variant(LEAST_MEMORY, prepare=checkpoint_plan(None)),
                        Variant(AT_PAPER_CUT, prepare=checkpoint_plan(1 - row.memory_cut)),
                        Variant(PAPER_OBJECTIVE, prepare=checkpoint_plan(None, objective='ogc'))]
            measurements, failed = benchmark_workload(work, variants, steps, device)
            for line in failed:
                print(f'  skipped {line}', flush=True)
            static = 2 * sum(param.numel() * param.element_size()
                             for param in work.model.parameters())
            keys = {LEAST_MEMORY: plan_key(None), AT_PAPER_CUT: plan_key(1 - row.memory_cut),
                    PAPER_OBJECTIVE: plan_key(None, 'ogc')}
            planning = {variant: work.plans[key].planning_seconds
                        for variant, key in keys.items() if key in work.plans}
            measured[key] = (tuple(measurements), _points(measurements, static, planning))
            del work
        measurements, points = measured[key]
        results.append(OGCResult(row, batch_size, measurements, points))
        for point in points:
            print(f'{name:13} {point.variant:18} activation cut {point.activation_cut:5.2f} '
                  f'(paper {row.memory_cut:.2f})  overhead {point.time_overhead:+5.2f} '
                  f'(paper {row.time_overhead:+.2f})  planned in {point.planning_seconds:.1f} s',
                  flush=True)
    return results


def _percent(value: float) -> str:
    return f'{100 * value:.0f}%'


def ogc_markdown(results: Sequence[OGCResult], noise: float = 0.0) -> str:
    """The table: per row, the paper's cut and overhead beside each of our plans'."""
    lines = ['| model (paper batch -> ours) | paper: cut / overhead | ours, least memory: '
             'activation cut / fwd-bwd cut / overhead / planned in | ours at the paper\'s cut: '
             'activation cut / overhead | paper\'s objective, our solver, this machine: '
             'activation cut / overhead | ours dominates the paper |',
             '|---|---|---|---|---|---|']
    for result in results:
        row = result.row
        by_variant = {point.variant: point for point in result.points}
        cells = [f'{row.paper_model}{" (" + row.builder.split(":")[1] + ")" if row.stand_in else ""}'
                 f' ({row.batch_size} -> {result.batch_size})',
                 f'{_percent(row.memory_cut)} / {_percent(row.time_overhead)}']
        least = by_variant.get(LEAST_MEMORY)
        cells.append('failed' if least is None else
                     f'{_percent(least.activation_cut)} / {_percent(least.forward_backward_cut)} / '
                     f'{_percent(least.time_overhead)} / {least.planning_seconds:.1f} s')
        for variant in (AT_PAPER_CUT, PAPER_OBJECTIVE):
            point = by_variant.get(variant)
            cells.append('failed' if point is None else
                         f'{_percent(point.activation_cut)} / {_percent(point.time_overhead)}')
        cells.append(', '.join(_NAMES[name] for name in result.dominating(noise)) or 'no')
        lines.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines) + '\n'


def write_ogc_results(results: Sequence[OGCResult], out: Path, scale: int, steps: int,
                      noise: float = 0.0) -> str:
    """Write ``ogc_table.md`` and ``ogc_table.json`` into ``out``; return the markdown table."""
    table = ogc_markdown(results, noise)
    stand_ins = sorted({f'- {r.row.paper_model}: {r.row.stand_in}.' for r in results
                        if r.row.stand_in})
    (out / 'ogc_table.md').write_text(
        f'# Checkpoint plans on the OGC table\n\nBatch sizes: the paper\'s divided by {scale}; '
        f'{steps} timed rounds; overheads are medians of alternated rounds.\n\n' + table
        + ('\nStand-ins:\n' + '\n'.join(stand_ins) + '\n' if stand_ins else ''))
    payload = {
        'provenance': provenance(), 'scale': scale, 'timed_rounds': steps,
        'rows': [{'row': result.row.name, 'paper_model': result.row.paper_model,
                  'paper_batch': result.row.batch_size, 'batch_size': result.batch_size,
                  'paper_memory_cut': result.row.memory_cut,
                  'paper_time_overhead': result.row.time_overhead,
                  'stand_in': result.row.stand_in,
                  'points': [vars(point) for point in result.points],
                  'measurements': compare(result.measurements, BASELINE)}
                 for result in results],
    }
    (out / 'ogc_table.json').write_text(json.dumps(payload, indent=1))
    return table
