"""mmdropit.bench.kernel_speed forms its table on the CPU (the GPU script's ``kernels`` stage runs
it on CUDA): shapes from the timm model's hooks, every kernel timed, JSON and Markdown written."""
from __future__ import annotations

import json
import os

import pytest
import torch

from mmdropit.bench.kernel_speed import _codec_kernels, main


def test_the_quick_cpu_run_writes_one_row_per_layer_and_kernel(tmp_path, capsys):
    rows = main([str(tmp_path), '--device', 'cpu', '--quick', '--models', 'deit_small'])
    assert {row.shape for row in rows} == {(1, 197, 384), (1, 197, 1536)}
    assert {row.kernel for row in rows} >= {'keep_topk-eager', 'scatter_bitmask'}
    assert all(row.ms > 0 and row.gemm_ms > 0 and row.copy_gbps > 0 for row in rows)
    assert '| deit_small | blocks.0.mlp.fc2 | 1 | fp32 | 1x197x1536 |' in capsys.readouterr().out
    written = json.loads((tmp_path / 'kernel_speed.json').read_text())
    assert len(written['rows']) == len(rows) and written['gamma'] == 0.9
    assert '| kernel |' in (tmp_path / 'kernel_speed.md').read_text()


def test_every_codec_row_runs_its_kernels_and_returns_what_they_read_and_wrote():
    """The codec rows (timed on a GPU only) call each Triton kernel as it takes its arguments:
    run here in Triton's interpreter on a CPU tensor."""
    triton = pytest.importorskip('triton', reason='Triton ships with the CUDA build of torch')
    if os.environ.get('TRITON_INTERPRET') != '1':
        pytest.skip(f'Triton {triton.__version__} not in its interpreter (TRITON_INTERPRET=1)')
    from mmdropit.kernels.cuda import codec_kernels
    flat = torch.randn(1000)
    rows = _codec_kernels(flat, codec_kernels)
    assert [kernel for kernel, _, _ in rows] == ['int8-encode', 'int8-decode', 'int4-encode',
                                                  'int4-decode', 'gelu-codes', 'gelu-scale']
    for kernel, _, function in rows:
        tensors = function()
        assert all(isinstance(t, torch.Tensor) for t in tensors) and len(tensors) >= 2, kernel
        assert tensors[-1].numel() > 0, kernel
