"""mmdropit.bench.kernel_speed forms its table on the CPU (the GPU script's ``kernels`` stage runs
it on CUDA): shapes from the timm model's hooks, every kernel timed, JSON and Markdown written."""
from __future__ import annotations

import json

from mmdropit.bench.kernel_speed import main


def test_the_quick_cpu_run_writes_one_row_per_layer_and_kernel(tmp_path, capsys):
    rows = main([str(tmp_path), '--device', 'cpu', '--quick', '--models', 'deit_small'])
    assert {row.shape for row in rows} == {(1, 197, 384), (1, 197, 1536)}
    assert {row.kernel for row in rows} >= {'keep_topk-eager', 'scatter_bitmask'}
    assert all(row.ms > 0 and row.gemm_ms > 0 and row.copy_gbps > 0 for row in rows)
    assert '| deit_small | blocks.0.mlp.fc2 | 1 | fp32 | 1x197x1536 |' in capsys.readouterr().out
    written = json.loads((tmp_path / 'kernel_speed.json').read_text())
    assert len(written['rows']) == len(rows) and written['gamma'] == 0.9
    assert '| kernel |' in (tmp_path / 'kernel_speed.md').read_text()
