"""Aggregate parity runs: mean and spread over seeds, difference to the baseline (of means, and
paired by seed with a 95% interval), the target check, a Markdown table and an
accuracy-vs-gamma plot.

Example::

    rows = summarize(runs)            # runs: what run_job returned
    print(markdown_table(rows))
    plot_parity(rows, 'work_dirs/parity/parity.png')
"""
from __future__ import annotations

import statistics
from collections.abc import Sequence
from pathlib import Path

#: Largest loss against the baseline (points, mean of the seeds) that counts as parity at the
#: target gamma -- the figures of the benchmark issue. Metrics without one are reported only.
TOLERANCE = {'top1': 0.5, 'box AP': 1.0}
TARGET_GAMMA = 0.9

#: Memory figures of the first iteration, as (key in MemoryReportHook's scalars, column).
MEMORY = (('saved_activation_mib', 'saved'), ('activation_peak_mib', 'activation peak'),
          ('step_peak_mib', 'step peak'))


def _mean(values: Sequence[float]) -> float | None:
    return statistics.mean(values) if values else None


def summarize(runs: Sequence[dict]) -> list[dict]:
    """One row per (model, gamma, metric) over the runs that finished.

    Each row holds the per-seed values, their mean and sample standard deviation, the
    difference of means to the same model's gamma-0 row (``None`` without a baseline), the
    paired difference (:func:`paired_difference`), whether
    the target is met (``None`` where no target applies), the mean memory figures (MiB) with
    their ratios to the baseline, and the mean seconds per run.

    Example:
        >>> runs = [dict(model='m', gamma=g, seed=s, metrics={'top1': 90.0 + g + s},
        ...              memory={'saved_activation_mib': 10 - 5 * g}, seconds=1.0)
        ...         for g in (0, 0.9) for s in (0, 1)]
        >>> row = summarize(runs)[1]
        >>> row['gamma'], row['mean'], round(row['delta'], 2), row['met']
        (0.9, 91.4, 0.9, True)
        >>> round(row['memory']['saved']['ratio'], 2)
        0.55
    """
    finished = [run for run in runs if 'error' not in run]
    groups: dict[tuple[str, float], list[dict]] = {}
    for run in sorted(finished, key=lambda run: (run['gamma'], run['seed'])):
        groups.setdefault((run['model'], run['gamma']), []).append(run)
    rows = []
    for (model, gamma), group in groups.items():
        memory = {column: _mean([run['memory'][key] for run in group if key in run['memory']])
                  for key, column in MEMORY}
        for metric in group[0]['metrics']:
            values = [run['metrics'][metric] for run in group if metric in run['metrics']]
            rows.append(dict(
                model=model, gamma=gamma, metric=metric,
                seeds=[run['seed'] for run in group], values=values,
                mean=statistics.mean(values),
                std=statistics.stdev(values) if len(values) > 1 else 0.0,
                memory=memory, seconds=_mean([run['seconds'] for run in group])))
    baselines = {(row['model'], row['metric']): dict(row) for row in rows if row['gamma'] == 0}
    for row in rows:
        base = baselines.get((row['model'], row['metric']))
        row['delta'] = row['mean'] - base['mean'] if base else None
        row['paired'] = paired_difference(row, base) if base and row['gamma'] else None
        tolerance = TOLERANCE.get(row['metric'])
        row['met'] = (row['delta'] >= -tolerance
                      if base and tolerance is not None and row['gamma'] == TARGET_GAMMA
                      else None)
        base_memory = base['memory'] if base else {}
        row['memory'] = {column: dict(mib=mib, ratio=(
            mib / base_memory[column] if mib is not None and base_memory.get(column) else None))
            for column, mib in row['memory'].items()}
    return sorted(rows, key=lambda row: (row['model'], row['metric'], row['gamma']))


def paired_difference(row: dict, base: dict, confidence: float = 0.95) -> dict | None:
    """The mean of the per-seed differences ``row - base`` over the seeds both ran, with its
    two-sided ``confidence`` interval (Student's t; ``None`` with fewer than two such seeds).

    With the plugin's own random generator a DropIT run and its baseline draw the same data
    order, initial weights, dropout and drop-path masks at the same seed, so pairing by seed
    removes the seed-to-seed spread that the difference of means carries.

    Example:
        >>> base = dict(seeds=[0, 1, 2], values=[90.0, 85.0, 88.0])
        >>> row = dict(seeds=[0, 1, 2], values=[89.5, 84.0, 88.0])
        >>> paired = paired_difference(row, base)
        >>> paired['n'], paired['mean'], round(paired['low'], 2), round(paired['high'], 2)
        (3, -0.5, -1.74, 0.74)
    """
    from scipy.stats import t

    base_values = dict(zip(base['seeds'], base['values']))
    differences = [value - base_values[seed] for seed, value in zip(row['seeds'], row['values'])
                   if seed in base_values]
    if len(differences) < 2:
        return None
    mean = statistics.mean(differences)
    half = (float(t.ppf((1 + confidence) / 2, len(differences) - 1))
            * statistics.stdev(differences) / len(differences) ** 0.5)
    return dict(n=len(differences), mean=mean, low=mean - half, high=mean + half,
                confidence=confidence)


def _number(value: float | None, spec: str) -> str:
    return '' if value is None else format(value, spec)


def _paired(paired: dict | None) -> str:
    if paired is None:
        return ''
    return f"{paired['mean']:+.2f} [{paired['low']:+.2f}, {paired['high']:+.2f}] (n={paired['n']})"


def markdown_table(rows: Sequence[dict]) -> str:
    """The rows as a Markdown table: accuracy per seed, mean +/- sd, difference to the baseline,
    the target check, memory of the first iteration (MiB and x baseline) and seconds per run."""
    memory_columns = [column for _, column in MEMORY]
    header = (['model', 'gamma', 'metric', 'per seed', 'mean +/- sd', 'vs baseline',
               'paired [95% CI]', 'target']
              + [f'{column} MiB (x)' for column in memory_columns] + ['s / run'])
    lines = ['| ' + ' | '.join(header) + ' |',
             '|' + '|'.join(['---'] * 3 + ['---'] + ['---:'] * (len(header) - 4)) + '|']
    for row in rows:
        tolerance = TOLERANCE.get(row['metric'])
        target = ('' if row['met'] is None else
                  f"{'met' if row['met'] else 'missed'} (>= -{tolerance})")
        memory = [f"{_number(row['memory'][column]['mib'], ',.1f')} "
                  f"({_number(row['memory'][column]['ratio'], '.2f')})"
                  for column in memory_columns]
        cells = [row['model'], f"{row['gamma']:g}", row['metric'],
                 ', '.join(f'{value:.1f}' for value in row['values']),
                 f"{row['mean']:.2f} +/- {row['std']:.2f}",
                 _number(row['delta'], '+.2f') if row['gamma'] else '', _paired(row.get('paired')),
                 target,
                 *memory, _number(row['seconds'], '.0f')]
        lines.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines) + '\n'


def plot_parity(rows: Sequence[dict], path: str | Path) -> Path:
    """Accuracy vs gamma, one panel per (model, metric): every seed as a dot, the mean with its
    standard deviation, and the baseline's mean with the target's tolerance as a band.

    Drawn on matplotlib's Agg canvas directly, leaving the caller's pyplot state alone.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    panels: dict[tuple[str, str], list[dict]] = {}
    for row in rows:
        panels.setdefault((row['model'], row['metric']), []).append(row)
    columns = min(3, len(panels))
    lines = -(-len(panels) // columns)
    figure = Figure(figsize=(4.2 * columns, 3.4 * lines), layout='constrained')
    FigureCanvasAgg(figure)
    axes = figure.subplots(lines, columns, squeeze=False).ravel()
    for ax, ((model, metric), group) in zip(axes, panels.items()):
        gammas = [row['gamma'] for row in group]
        for row in group:
            ax.scatter([row['gamma']] * len(row['values']), row['values'], s=12,
                       color='0.6', zorder=2)
        ax.errorbar(gammas, [row['mean'] for row in group], yerr=[row['std'] for row in group],
                    marker='o', capsize=3, color='tab:blue', zorder=3, label='mean +/- sd')
        base = next((row for row in group if row['gamma'] == 0), None)
        if base is not None:
            tolerance = TOLERANCE.get(metric, 0.0)
            ax.axhline(base['mean'], color='tab:green', linestyle='--', label='baseline')
            if tolerance:
                ax.axhspan(base['mean'] - tolerance, base['mean'] + tolerance, color='tab:green',
                           alpha=0.12, label=f'+/- {tolerance:g}')
        ax.set_title(f'{model}', fontsize=9)
        ax.set_xlabel('DropIT gamma (0 = baseline)')
        ax.set_ylabel(metric)
        ax.set_xticks(sorted(set(gammas)))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    for ax in axes[len(panels):]:
        ax.set_visible(False)
    figure.savefig(path, dpi=110)
    return Path(path)
