"""mmdropit.bench.kernel_speed forms its tables on the CPU (the GPU script's ``kernels`` stage runs
it on CUDA): shapes from the timm model's hooks, every kernel timed, JSON and Markdown written;
the Triton launches replayed one by one in Triton's interpreter."""
from __future__ import annotations

import json
import os

import pytest
import torch
import torch.nn.functional as F

from mmdropit.bench.kernel_speed import (LayerInput, Timer, _codec_kernels, launch_rows, main,
                                         write)
from mmdropit.bench.triton_launches import recorded_launches
from mmdropit.reporting.provenance import provenance


def test_the_quick_cpu_run_writes_one_row_per_layer_and_kernel(tmp_path, capsys):
    rows = main([str(tmp_path), '--device', 'cpu', '--quick', '--models', 'deit_small'])
    assert {row.shape for row in rows} == {(1, 197, 384), (1, 197, 1536)}
    assert {row.kernel for row in rows} >= {'keep_topk-eager', 'keep_random-eager',
                                            'scatter_bitmask'}
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


def _triton_dropit_kernels():
    triton = pytest.importorskip('triton', reason='Triton ships with the CUDA build of torch')
    if os.environ.get('TRITON_INTERPRET') != '1':
        pytest.skip(f'Triton {triton.__version__} not in its interpreter (TRITON_INTERPRET=1)')
    from mmdropit.kernels.cuda import dropit_kernels
    return dropit_kernels


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float32], ids=str)
def test_replayed_launches_redo_the_selection_bit_for_bit(dtype):
    """What the launch table times is the real work: ``keep_topk``'s launches replayed in order
    after the histograms are zeroed (as each timed round does) write the same bitmask and
    values again."""
    kernels = _triton_dropit_kernels()
    flat = torch.randn(3 * kernels.BLOCK + 77, generator=torch.Generator().manual_seed(0)).to(dtype)
    with recorded_launches(kernels) as recorded:
        bits, values = kernels.keep_topk(flat, 1234, True)
    expected = bits.clone(), values.clone()
    write = recorded.triton[-1]
    bits_out, values_out = write.argument('first_ptr'), write.argument('values_ptr')
    bits_out.zero_()
    values_out.zero_()
    recorded.triton[0].argument('hist_ptr').zero_()
    for launch in recorded.triton:
        launch.replay()
    assert torch.equal(bits_out, expected[0]) and torch.equal(values_out, expected[1])


def test_the_launch_table_names_each_pass_of_a_selection_and_a_rebuild(tmp_path):
    kernels = _triton_dropit_kernels()
    layer = LayerInput('deit_small', 'blocks.0.attn.qkv', (1, 197, 384), F.linear, (1152, 384))
    timer = Timer(torch.device('cpu'), warmup=1, reps=2)
    rows = [*launch_rows(layer, 1, 'bf16', timer, kernels),
            *launch_rows(layer, 1, 'fp32', timer, kernels)]
    assert [row.launch for row in rows] == [
        'digit_histogram[0]', 'digit_histogram[1]', 'write', 'popcount', 'scatter',
        'digit_histogram[0]', 'digit_histogram[1]', 'digit_histogram[2]', 'digit_histogram[3]',
        'write', 'popcount', 'scatter']
    assert all(row.us > 0 and row.copy_us > 0 and row.numel == 197 * 384 for row in rows)
    write(tmp_path, provenance([]), torch.device('cpu'), [], rows)
    assert '| deit_small | blocks.0.attn.qkv | 1 | bf16 | 75648 | write |' in \
        (tmp_path / 'kernel_speed.md').read_text()
    assert len(json.loads((tmp_path / 'kernel_speed.json').read_text())['launches']) == 12
