"""Tables and JSON that compare measured training steps with a baseline.

A :class:`Measurement` holds what the meters found for one (model, variant) pair. :func:`compare`
turns a list of them into rows with ratios to the baseline variant of the same model; the
markdown table and the JSON dump are both written from those rows.
"""
from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from ..common.units import MIB, mib
from ..memory import SavedActivations, StepPeak



@dataclass(frozen=True)
class Measurement:
    """What was measured for one model under one variant.

    Attributes:
        model: Model name, e.g. ``'deit_tiny'``.
        variant: Variant name, e.g. ``'baseline'`` or ``'grad-ckpt'``.
        saved: Saved-activation bytes of one step.
        peak: Peak memory of one step by category.
        step_seconds: Median seconds of one training step.
        time_ratio: Median of the per-round ratios of this variant's step time to the baseline's,
            timed alternately in one process; ``None`` falls back to the ratio of the medians.
        round_seconds: The step time of every timed round, in order (shows the noise).
        host_seconds: On a GPU, the median seconds until the step's calls returned, before
            waiting for the GPU: near ``step_seconds``, the step is host-bound (Python and
            kernel launches, or a wait for the GPU inside the step), and work the GPU does
            beside it costs no time; ``None`` on a CPU.

    Example:
        >>> m = Measurement('mlp', 'baseline', SavedActivations(6144, 2, {'float32': 6144}),
        ...                 StepPeak('cpu', 9000, activation_peak_bytes=6000), 0.01)
        >>> m.peak.activation_peak_bytes
        6000
    """

    model: str
    variant: str
    saved: SavedActivations
    peak: StepPeak
    step_seconds: float
    time_ratio: float | None = None
    round_seconds: tuple[float, ...] = ()
    host_seconds: float | None = None


def _ratio(value: float | None, base: float | None) -> float | None:
    if value is None or not base:
        return None
    return value / base


def compare(measurements: Sequence[Measurement],
            baseline: str = 'baseline') -> list[dict[str, Any]]:
    """One row of values and ratios per measurement, ratios to the same model's baseline.

    Args:
        measurements: The measurements, in the order the rows should have.
        baseline: Name of the variant the ratios divide by. A model without it gets ``None``
            ratios.

    Returns:
        Dicts with keys ``model``, ``variant``, ``saved_bytes``, ``saved_ratio``, ``peak_bytes``,
        ``peak_ratio``, ``activation_peak_bytes``, ``activation_peak_ratio``, ``step_seconds``,
        ``time_ratio``, ``host_seconds``.

    Example:
        >>> base = Measurement('m', 'baseline', SavedActivations(100), StepPeak('cpu', 400), 2.0)
        >>> half = Measurement('m', 'half', SavedActivations(50), StepPeak('cpu', 300), 3.0)
        >>> [row['saved_ratio'] for row in compare([base, half])]
        [1.0, 0.5]
    """
    bases = {m.model: m for m in measurements if m.variant == baseline}
    rows = []
    for m in measurements:
        base = bases.get(m.model)
        time_ratio = m.time_ratio
        if time_ratio is None and base is not None:
            time_ratio = _ratio(m.step_seconds, base.step_seconds)
        rows.append({
            'model': m.model,
            'variant': m.variant,
            'saved_bytes': m.saved.total_bytes,
            'saved_ratio': _ratio(m.saved.total_bytes, base and base.saved.total_bytes),
            'peak_bytes': m.peak.peak_bytes,
            'peak_ratio': _ratio(m.peak.peak_bytes, base and base.peak.peak_bytes),
            'activation_peak_bytes': m.peak.activation_peak_bytes,
            'activation_peak_ratio': _ratio(m.peak.activation_peak_bytes,
                                            base and base.peak.activation_peak_bytes),
            'step_seconds': m.step_seconds,
            'time_ratio': time_ratio if base is not None else None,
            'host_seconds': m.host_seconds,
        })
    return rows


def _mib(nbytes: int | None) -> str:
    return 'n/a' if nbytes is None else mib(nbytes, unit=False, grouped=True)


def _times(ratio: float | None) -> str:
    return 'n/a' if ratio is None else f'{ratio:.2f}'


def markdown_table(measurements: Sequence[Measurement], baseline: str = 'baseline') -> str:
    """A markdown table of values (MiB, seconds) and their ratios to the baseline; with a
    ``host s`` column when the steps were timed on a GPU.

    Args:
        measurements: The measurements, one row each.
        baseline: Name of the variant the ratios divide by.

    Returns:
        The table as markdown text, ending with a newline.

    Example:
        >>> base = Measurement('m', 'baseline', SavedActivations(MIB), StepPeak('cpu', 4 * MIB),
        ...                    2.0)
        >>> print(markdown_table([base]).splitlines()[2])
        | m | baseline | 1.0 | 1.00 | 4.0 | 1.00 | n/a | n/a | 2.000 | 1.00 |
        >>> on_gpu = Measurement('m', 'baseline', SavedActivations(MIB),
        ...                      StepPeak('cuda', 4 * MIB), 2.0, host_seconds=1.9)
        >>> print(markdown_table([on_gpu]).splitlines()[2])
        | m | baseline | 1.0 | 1.00 | 4.0 | 1.00 | n/a | n/a | 2.000 | 1.00 | 1.900 |
    """
    host = any(m.host_seconds is not None for m in measurements)
    lines = [
        '| model | variant | saved MiB | x base | peak MiB | x base | activation peak MiB | x base '
        '| step s | x base |' + (' host s |' if host else ''),
        '|---|---|---:|---:|---:|---:|---:|---:|---:|---:|' + ('---:|' if host else ''),
    ]
    for row in compare(measurements, baseline):
        cells = [row['model'], row['variant'],
                 _mib(row['saved_bytes']), _times(row['saved_ratio']),
                 _mib(row['peak_bytes']), _times(row['peak_ratio']),
                 _mib(row['activation_peak_bytes']), _times(row['activation_peak_ratio']),
                 f"{row['step_seconds']:.3f}", _times(row['time_ratio'])]
        if host:
            cells.append('n/a' if row['host_seconds'] is None else f"{row['host_seconds']:.3f}")
        lines.append('| ' + ' | '.join(cells) + ' |')
    return '\n'.join(lines) + '\n'


def write_json(measurements: Sequence[Measurement], path: str | Path,
               baseline: str = 'baseline', meta: dict[str, Any] | None = None) -> Path:
    """Write every number (rows with ratios, plus the full meter results) as JSON.

    Args:
        measurements: The measurements.
        path: The file to write; its folder must exist.
        baseline: Name of the variant the ratios divide by.
        meta: Anything that describes the run (device, batch size, versions).

    Returns:
        ``path`` as a :class:`~pathlib.Path`.

    Example:
        >>> import tempfile
        >>> base = Measurement('m', 'baseline', SavedActivations(8), StepPeak('cpu', 16), 1.0)
        >>> out = write_json([base], Path(tempfile.mkdtemp()) / 'bench.json', meta={'batch': 4})
        >>> json.loads(out.read_text())['rows'][0]['saved_ratio']
        1.0
    """
    rows = compare(measurements, baseline)
    for row, m in zip(rows, measurements):
        row['round_seconds'] = list(m.round_seconds)
        row['saved'] = asdict(m.saved)
        row['peak'] = asdict(m.peak)
    path = Path(path)
    path.write_text(json.dumps({'meta': meta or {}, 'baseline': baseline, 'rows': rows},
                               indent=2) + '\n')
    return path


def progress_line(row: dict[str, Any]) -> str:
    """One row of :func:`compare` as the line printed while a benchmark runs.

    Example:
        >>> base = Measurement('m', 'baseline', SavedActivations(MIB), StepPeak('cpu', 4 * MIB),
        ...                    2.0)
        >>> progress_line(compare([base])[0]).split()[:5]
        ['m', 'baseline', 'saved', '1.0', 'MiB']
    """
    def size(key: str) -> str:
        return 'n/a' if row[key] is None else mib(row[key])

    def times(key: str) -> str:
        return 'n/a' if row[key] is None else f'x{row[key]:.2f}'

    return (f"  {row['model']:<12} {row['variant']:<14} saved {size('saved_bytes')} "
            f"({times('saved_ratio')})  peak {size('peak_bytes')} ({times('peak_ratio')})  "
            f"activation peak {size('activation_peak_bytes')} ({times('activation_peak_ratio')})  "
            f"step {row['step_seconds']:.3f} s ({times('time_ratio')})")
