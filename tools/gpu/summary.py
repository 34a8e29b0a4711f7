"""Print one short table of every ``benchmark.json`` under a folder (the last thing a GPU run
prints, so it is in the device tool's output tail).

Example::

    python tools/gpu/summary.py work_dirs/gpu
"""
from __future__ import annotations

import json
import sys
from pathlib import Path


def summary(folder: Path) -> str:
    """The table: per model and variant, the step peak, saved activations and step time as
    ratios to the baseline, the host's share of the step (``host``: near 1, host-bound), and
    the baseline's peak in GiB; then each frontier run's points (:func:`frontier_summary`)."""
    lines = [f'{"model":12} {"variant":28} {"peak":>6} {"saved":>6} {"time":>6} {"host":>5}  '
             'baseline peak']
    for path in sorted(folder.rglob('benchmark.json')):
        result = json.loads(path.read_text())
        device = result.get('meta', {}).get('device', '?')
        base_peaks = {row['model']: row['peak_bytes'] for row in result['rows']
                      if row['variant'] == result['baseline']}
        for row in result['rows']:
            host = row.get('host_seconds')
            host_share = '  n/a' if host is None else f'{host / row["step_seconds"]:5.2f}'
            lines.append(f'{row["model"]:12} {row["variant"]:28} {row["peak_ratio"]:6.2f} '
                         f'{row["saved_ratio"]:6.2f} {row["time_ratio"]:6.2f} {host_share}  '
                         f'{base_peaks[row["model"]] / 2**30:.2f} GiB ({device})')
    if len(lines) == 1:
        return f'no benchmark.json under {folder}'
    return '\n'.join(lines + frontier_summary(folder))


def _ratio(value: float | None) -> str:
    return '   n/a' if value is None else f'{value:6.2f}'


def frontier_summary(folder: Path) -> list[str]:
    """The frontier of every frontier run under ``folder`` (``--frontier``): per point its peak
    and time as ratios to the plain step of its precision, its peak to the fp32 step's, what
    dominates it, and for ours the checks (a simple point >10% faster at an equal or lower
    peak; the fastest point that fits a budget, our time over its)."""
    lines = []
    for path in sorted(folder.rglob('benchmark.json')):
        for model, rows in json.loads(path.read_text()).get('meta', {}).get('frontier',
                                                                            {}).items():
            lines += ['', f'frontier {model}: {"point":26} {"kind":6} {"peak":>6} {"x fp32":>6} '
                      f'{"time":>6}  dominated by / checks']
            for row in rows:
                checks = ''.join([
                    f'  BEATEN by {row["beaten_by"]} ({row["beaten_time"]:.2f}x)'
                    if row['beaten_by'] else '',
                    f'  fastest fitting {row["fastest_fitting"]} '
                    f'({row["vs_fastest_fitting"]:.2f}x)' if row['fastest_fitting'] else ''])
                lines.append(f'{"":>{len(model) + 10}}{row["name"]:26} '
                             f'{"ours" if row["ours"] else "simple":6} '
                             f'{_ratio(row["peak_ratio"])} {_ratio(row["peak_vs_fp32"])} '
                             f'{_ratio(row["time_ratio"])}  '
                             f'{row["dominated_by"] or "frontier"}{checks}')
    return lines


if __name__ == '__main__':
    if len(sys.argv) != 2:
        sys.exit('usage: python tools/gpu/summary.py FOLDER')
    print(summary(Path(sys.argv[1])))
