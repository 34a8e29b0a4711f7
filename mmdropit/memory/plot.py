"""A PNG of grouped bars: each variant's ratios to the baseline, per model and per metric."""
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
    axes[0].legend(fontsize='small')
    path = Path(path)
    figure.savefig(path, dpi=120)
    return path
