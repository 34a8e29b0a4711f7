"""PNG plots of benchmark results: grouped bars of ratios to the baseline, memory-vs-time
trade-off curves, and allocated-memory timelines of CUDA memory snapshots."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .report import Measurement, compare

METRICS = (
    ('saved_ratio', 'saved activations'),
    ('peak_ratio', 'step peak'),
    ('activation_peak_ratio', 'activation peak'),
    ('time_ratio', 'step time'),
)


def plot_ratios(measurements: Sequence[Measurement], path: str | Path,
                baseline: str = 'baseline') -> Path:
    """Draw one panel per metric, one bar group per model, one bar per variant.

    The figure is drawn with matplotlib's Agg canvas directly, so the caller's pyplot backend
    and state are left alone. Ratios that are unknown (no baseline, or an activation peak
    that the device cannot break down) are left out of their panel.

    Args:
        measurements: The measurements to draw.
        path: The PNG file to write; its folder must exist.
        baseline: Name of the variant the ratios divide by (drawn as the line at 1).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Example:
        >>> import tempfile
        >>> from mmdropit.memory import SavedActivations, StepPeak
        >>> base = Measurement('m', 'baseline', SavedActivations(8), StepPeak('cpu', 16), 1.0)
        >>> half = Measurement('m', 'half', SavedActivations(4), StepPeak('cpu', 12), 1.5)
        >>> plot_ratios([base, half], Path(tempfile.mkdtemp()) / 'ratios.png').suffix
        '.png'
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = compare(measurements, baseline)
    models = list(dict.fromkeys(row['model'] for row in rows))
    variants = list(dict.fromkeys(row['variant'] for row in rows))
    width = 0.8 / len(variants)
    figure = Figure(figsize=(max(6.0, 1.6 * len(models) * len(METRICS) / 2), 6.5),
                    layout='constrained')
    FigureCanvasAgg(figure)
    axes = figure.subplots(2, 2).ravel()
    for ax, (key, title) in zip(axes, METRICS):
        for v, variant in enumerate(variants):
            positions, heights = [], []
            for i, model in enumerate(models):
                ratio = next((row[key] for row in rows
                              if row['model'] == model and row['variant'] == variant), None)
                if ratio is not None:
                    positions.append(i + (v - (len(variants) - 1) / 2) * width)
                    heights.append(ratio)
            ax.bar(positions, heights, width, label=variant)
        ax.axhline(1.0, color='black', linewidth=0.8)
        ax.set_title(f'{title} (x {baseline})')
        ax.set_xticks(range(len(models)), models, rotation=20)
    handles, labels = axes[0].get_legend_handles_labels()  # below the panels, not over bars
    figure.legend(handles, labels, loc='outside lower center', fontsize='small',
                  ncols=min(len(labels), 4))
    path = Path(path)
    figure.savefig(path, dpi=120)
    return path


def plot_tradeoff(measurements: Sequence[Measurement], path: str | Path,
                  baseline: str = 'baseline', curve: Sequence[str] = (),
                  memory: str = 'activation_peak_ratio',
                  background: Sequence[str] = ()) -> Path:
    """Draw memory against step time (both as ratios to the baseline), one panel per model:
    the variants named in ``curve`` joined as a line (by memory), those in ``background`` as
    small grey points without labels, every other variant as a labelled point.

    Args:
        measurements: The measurements to draw.
        path: The PNG file to write; its folder must exist.
        baseline: Name of the variant the ratios divide by (the point at (1, 1)).
        curve: Variants that form the curve (e.g. the planner at several budgets).
        memory: The memory ratio drawn: ``'activation_peak_ratio'`` or ``'peak_ratio'`` (the
            whole step's peak).
        background: Variants drawn as unlabelled grey points (e.g. a grid of combinations).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Example:
        >>> import tempfile
        >>> from mmdropit.memory import SavedActivations, StepPeak
        >>> rows = [Measurement('m', name, SavedActivations(8), StepPeak('cpu', 16, {}, peak),
        ...                     time) for name, peak, time in
        ...         [('baseline', 10, 1.0), ('b-0.5', 5, 1.1), ('b-0.3', 3, 1.3), ('x', 4, 1.4)]]
        >>> path = Path(tempfile.mkdtemp()) / 'curve.png'
        >>> plot_tradeoff(rows, path, curve=['b-0.5', 'b-0.3']).suffix
        '.png'
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = [row for row in compare(measurements, baseline)
            if row[memory] is not None and row['time_ratio'] is not None]
    models = list(dict.fromkeys(row['model'] for row in rows))
    figure = Figure(figsize=(5.5 * max(1, len(models)), 4.5), layout='constrained')
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, max(1, len(models)), squeeze=False)[0]
    for ax, model in zip(axes, models):
        mine = [row for row in rows if row['model'] == model]
        line = sorted((row for row in mine if row['variant'] in curve),
                      key=lambda row: row[memory])
        if line:
            ax.plot([r['time_ratio'] for r in line], [r[memory] for r in line],
                    'o-', color='tab:blue', label='planner (budgets)')
        grey = [row for row in mine if row['variant'] in background]
        if grey:
            ax.plot([r['time_ratio'] for r in grey], [r[memory] for r in grey], '.',
                    color='0.6', label='grid (every combination)')
        for row in mine:
            if row['variant'] in curve or row['variant'] in background:
                continue
            ax.plot(row['time_ratio'], row[memory], 's', markersize=7)
            ax.annotate(row['variant'], (row['time_ratio'], row[memory]),
                        textcoords='offset points', xytext=(5, 4), fontsize=8)
        ax.set_title(model)
        ax.set_xlabel('step time (x baseline)')
        ax.set_ylabel(f'{"activation peak" if memory.startswith("activation") else "step peak"} '
                      '(x baseline)')
        ax.grid(alpha=0.3)
        if line or grey:
            ax.legend(loc='best', fontsize=8)
    figure.savefig(path, dpi=110)
    return Path(path)


def allocated_timeline(recorded: dict) -> tuple[list[float], list[int]]:
    """Bytes the CUDA caching allocator held for tensors after each event of a memory snapshot.

    ``recorded`` is what ``torch.cuda.memory._snapshot()`` returns after
    ``torch.cuda.memory._record_memory_history()``: the blocks alive at its end (``segments``)
    and the allocations and frees since recording began (``device_traces``, device 0 read).
    Blocks allocated before recording (parameters, optimizer state, the batch) are the level the
    timeline starts from. Times are milliseconds from the first event, on the host's clock: when
    each block was asked for, ahead of the GPU running the kernel that uses it.

    Example:
        >>> recorded = {'segments': [{'device': 0, 'blocks': [
        ...     {'size': 512, 'state': 'active_allocated'}, {'size': 256, 'state': 'inactive'}]}],
        ...     'device_traces': [[{'action': 'alloc', 'size': 256, 'time_us': 10},
        ...                        {'action': 'free_requested', 'size': 256, 'time_us': 20},
        ...                        {'action': 'free_completed', 'size': 256, 'time_us': 20}]]}
        >>> allocated_timeline(recorded)
        ([0.0, 0.0, 0.01, 0.01], [512, 768, 768, 512])
    """
    changes = {'alloc': 1, 'free_completed': -1}
    trace = recorded['device_traces'][0] if recorded['device_traces'] else []
    alive = sum(block['size'] for segment in recorded['segments'] if segment['device'] == 0
                for block in segment['blocks'] if block['state'] == 'active_allocated')
    level = alive - sum(changes.get(event['action'], 0) * event['size'] for event in trace)
    start = trace[0]['time_us'] if trace else 0
    times, allocated = [0.0], [level]
    for event in trace:
        level += changes.get(event['action'], 0) * event['size']
        times.append((event['time_us'] - start) / 1000)
        allocated.append(level)
    return times, allocated


def plot_allocation_timelines(snapshots: dict[str, dict], path: str | Path,
                              title: str = '') -> Path:
    """Draw the allocated memory of each named snapshot over its step, one line each.

    Example (``recorded`` from ``torch.cuda.memory._snapshot()``)::

        plot_allocation_timelines({'baseline': recorded, 'ckpt-plan-min': planned},
                                  'work_dirs/snapshot_deit_small.png', 'DeiT-S, batch 64')
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 4.5), layout='constrained')
    FigureCanvasAgg(figure)
    ax = figure.subplots()
    for name, recorded in snapshots.items():
        times, allocated = allocated_timeline(recorded)
        ax.step(times, [value / 2**30 for value in allocated], where='post',
                label=f'{name} (peak {max(allocated) / 2**30:.2f} GiB)')
    ax.set_xlabel('host time in the recorded step (ms): when each block was asked for')
    ax.set_ylabel('allocated (GiB)')
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    figure.savefig(path, dpi=110)
    return Path(path)


_PRECISION_COLOURS = {'fp32': 'tab:blue', 'bf16': 'tab:orange', 'fp16': 'tab:purple',
                      'lossy': 'tab:green'}


def plot_frontier(placed: dict, path: str | Path) -> Path:
    """Draw each model's frontier: step peak against step time, both as ratios to the fp32
    plain step, one panel per model. Simple baselines are circles, ours stars, coloured by
    precision; each precision's frontier (its points and the more exact ones that no point at
    least as exact dominates) is a staircase in its colour; dominated points are drawn faint.

    Args:
        placed: Lists of :class:`~.frontier.Placed` by model (:func:`~.frontier.place`).
        path: The PNG file to write; its folder must exist.

    Example:
        >>> import tempfile
        >>> from .frontier import Point, place
        >>> rows = place([Point('baseline', 10, 1.0), Point('grad-ckpt', 4, 1.3),
        ...               Point('budget-0.5', 5, 1.1, ours=True)])
        >>> plot_frontier({'m': rows}, Path(tempfile.mkdtemp()) / 'frontier.png').suffix
        '.png'
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    from .frontier import EXACTNESS, dominates

    models = list(placed)
    figure = Figure(figsize=(6.5 * max(1, len(models)), 5.5), layout='constrained')
    FigureCanvasAgg(figure)
    axes = figure.subplots(1, max(1, len(models)), squeeze=False)[0]
    for ax, model in zip(axes, models):
        rows = [p for p in placed[model] if p.peak_vs_fp32 is not None
                and p.time_vs_fp32 is not None]
        for precision in dict.fromkeys(p.point.precision for p in rows):
            arena = [p for p in rows if EXACTNESS[p.point.precision] <= EXACTNESS[precision]]
            line = sorted((p for p in arena if not any(dominates(q.point, p.point)
                                                       for q in arena)),
                          key=lambda p: p.time_vs_fp32)
            ax.step([p.time_vs_fp32 for p in line], [p.peak_vs_fp32 for p in line], where='post',
                    color=_PRECISION_COLOURS.get(precision, 'black'), alpha=0.6,
                    label=f'frontier, {precision} and more exact')
        for p in rows:
            ax.plot(p.time_vs_fp32, p.peak_vs_fp32, '*' if p.point.ours else 'o',
                    markersize=11 if p.point.ours else 7,
                    color=_PRECISION_COLOURS.get(p.point.precision, 'black'),
                    alpha=1.0 if p.on_frontier else 0.35)
            ax.annotate(p.name, (p.time_vs_fp32, p.peak_vs_fp32), textcoords='offset points',
                        xytext=(5, 3), fontsize=7, alpha=1.0 if p.on_frontier else 0.5)
        ax.set_title(f'{model} (o simple, * ours; faint: dominated)')
        ax.set_xlabel('step time (x fp32 plain step)')
        ax.set_ylabel('step peak (x fp32 plain step)')
        ax.grid(alpha=0.3)
        ax.legend(loc='upper right', fontsize=7)
    figure.savefig(path, dpi=110)
    return Path(path)
