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
    the baseline's peak in GiB."""
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
    return '\n'.join(lines) if len(lines) > 1 else f'no benchmark.json under {folder}'


if __name__ == '__main__':
    if len(sys.argv) != 2:
        sys.exit('usage: python tools/gpu/summary.py FOLDER')
    print(summary(Path(sys.argv[1])))
