"""The fused CPU kernels give bit-identical saved tensors to DropIT's eager path, and a missing
or stale build falls back to that path with one warning line."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from mmdropit import from_dropit, to_dropit
from mmdropit.codecs.derivative_codes import encode as encode_derivatives
from mmdropit.codecs.derivative_codes import scale_gradient
from mmdropit.common.random_source import reseed
from mmdropit.dropit.compact import encode, pack_bits, scatter_kept, smaller_encoding
from mmdropit.dropit.ops import keep_sampled
from mmdropit.dropit.strategies import kept_count, mink
from mmdropit.kernels import cpu as fused_cpu
from mmdropit.kernels.cpu.library import library_path
from mmdropit.kernels.switch import eager_only
from tests.helpers.drawn_keys import cpu_generator_seed, drawn_keys
from tests.helpers.kernel_inputs import (KINDS, derivative_code_input, derivative_table_on,
                                         kernel_input)

ROOT = Path(__file__).resolve().parents[2]
pytestmark = pytest.mark.skipif(shutil.which('c++') is None, reason='no C++ compiler here')

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
# 600_000 > 8 * 65_536: the sampled bracket; smaller sizes: the histograms only
SIZES = (1, 7, 64, 1000, 70_001, 600_003)


@pytest.fixture(autouse=True, scope='module')
def loaded_kernels():
    """The tests call ``torch.ops.mmdropit_cpu`` directly: load it whatever runs first."""
    fused_cpu.load()


def test_kernels_are_built_here():
    assert fused_cpu.load(), f'run `make env`: no usable library at {library_path()}'


@pytest.mark.parametrize('dtype', DTYPES, ids=str)
@pytest.mark.parametrize('numel', SIZES)
@pytest.mark.parametrize('kind', KINDS)
def test_keep_topk_equals_eager_mink(dtype, numel, kind):
    x = kernel_input(numel, dtype, kind)
    for gamma in (0.0, 0.5, 0.9, 0.99):
        kept = kept_count(numel, gamma)
        keep, _ = mink(x, gamma)
        for encoding in ('bitmask', 'indices'):
            eager = encode(x, keep, 1.0, encoding)
            fused = torch.ops.mmdropit_cpu.keep_topk(x, kept, encoding == 'bitmask')
            assert torch.equal(fused[0], eager[0]), (gamma, encoding)
            assert torch.equal(fused[1], eager[1]), (gamma, encoding)
        assert int(fused[1].numel()) == kept


@pytest.mark.parametrize('dtype', DTYPES, ids=str)
@pytest.mark.parametrize('numel', SIZES)
def test_keep_random_keeps_the_count_scaled_whatever_the_threads(dtype, numel):
    """``random``'s kernel keeps exactly ``kept`` elements, their values times the scale in
    memory order (as the eager product rounds them), the same set in both encodings, and the
    same tensors on one thread as on two; another seed keeps another set."""
    x = kernel_input(numel, dtype, 'normal')
    ops = torch.ops.mmdropit_cpu
    for gamma in (0.0, 0.5, 0.9, 0.99):
        kept = kept_count(numel, gamma)
        scale = numel / max(kept, 1)
        bits, values = ops.keep_random(x, kept, True, scale, _seeded(7))
        keep = scatter_kept(bits, torch.ones(kept, dtype=dtype), numel, 'bitmask') != 0
        assert int(keep.sum()) == kept
        assert torch.equal(values, x[keep] * scale)
        indices, same_values = ops.keep_random(x, kept, False, scale, _seeded(7))
        assert torch.equal(indices.long(), keep.nonzero().view(-1))
        assert torch.equal(same_values, values)
        threads = torch.get_num_threads()
        try:
            torch.set_num_threads(1)
            alone = ops.keep_random(x, kept, True, scale, _seeded(7))
        finally:
            torch.set_num_threads(threads)
        assert torch.equal(alone[0], bits) and torch.equal(alone[1], values)
        if 20 <= kept <= numel - 20:
            assert not torch.equal(ops.keep_random(x, kept, True, scale, _seeded(8))[0], bits)


def _seeded(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


@pytest.mark.parametrize('dtype', DTYPES, ids=str)
@pytest.mark.parametrize('numel', (1, 1000, 70_001, 600_003))
def test_keep_random_keeps_the_largest_drawn_keys(dtype, numel):
    """The kernel keeps the elements of the largest keys computed apart (NumPy) from the seed
    its generator draws first, ties first in memory order: the keys the Triton kernels draw."""
    x = kernel_input(numel, dtype, 'normal')
    for gamma in (0.5, 0.9, 0.99):
        kept = kept_count(numel, gamma)
        keep, _ = mink(drawn_keys(cpu_generator_seed(11), numel), gamma)
        bits, _ = torch.ops.mmdropit_cpu.keep_random(x, kept, True, 1.0, _seeded(11))
        assert torch.equal(bits, pack_bits(keep)), gamma


def test_keep_random_keeps_each_element_as_often():
    """Over 4000 generator seeds each of 40 elements is kept at gamma 0.9 as often as any
    other, within 4.5 standard errors of ``kept / numel`` (an unbiased estimate needs that),
    and pairs of neighbours as often as independent draws without replacement keep them."""
    numel, kept, draws = 40, 4, 4000
    x = torch.randn(numel)
    singles = torch.zeros(numel, dtype=torch.float64)
    neighbours = torch.zeros(numel - 1, dtype=torch.float64)
    for seed in range(draws):
        bits, _ = torch.ops.mmdropit_cpu.keep_random(x, kept, True, 1.0, _seeded(seed))
        keep = scatter_kept(bits, torch.ones(kept), numel, 'bitmask').double()
        singles += keep
        neighbours += keep[1:] * keep[:-1]
    share = kept / numel
    assert ((singles - draws * share).abs() <= 4.5 * (draws * share * (1 - share)) ** 0.5).all()
    pair = share * (kept - 1) / (numel - 1)
    assert abs(neighbours.mean() - draws * pair) <= 4.5 * (draws * pair / (numel - 1)) ** 0.5


@pytest.mark.parametrize('dtype', DTYPES, ids=str)
@pytest.mark.parametrize('numel', (1, 9, 70_001, 600_003))
def test_scatter_bitmask_equals_eager(dtype, numel, monkeypatch):
    x = kernel_input(numel, dtype, 'normal')
    bits, values = torch.ops.mmdropit_cpu.keep_topk(x, kept_count(numel, 0.9), True)
    fused = scatter_kept(bits, values, numel, 'bitmask')
    monkeypatch.setenv('MMDROPIT_FUSED', '0')
    eager = scatter_kept(bits, values, numel, 'bitmask')
    assert torch.equal(fused, eager)
    assert torch.equal(fused[fused != 0], x[fused != 0])


@pytest.mark.parametrize('dtype', (torch.float32, torch.bfloat16), ids=str)
@pytest.mark.parametrize('gamma', (0.5, 0.9, 0.985))  # 0.985: indices are the smaller
def test_sampled_threshold_path_equals_eager(dtype, gamma, monkeypatch):
    x = kernel_input(600_003, dtype, 'scaled')
    reseed(3)
    fused, fused_layout = keep_sampled(x, gamma, x.shape, None)
    monkeypatch.setenv('MMDROPIT_FUSED', '0')
    reseed(3)
    eager, eager_layout = keep_sampled(x, gamma, x.shape, None)
    assert fused_layout == eager_layout
    assert fused_layout.encoding == smaller_encoding(x.numel(), fused[1].numel(), x.element_size())
    for got, want in zip(fused, eager):
        assert torch.equal(got, want)


def _step_gradients(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad()
    model(x).square().mean().backward()
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.parametrize('strategy', ['mink', 'mink_approx'])
def test_training_step_gradients_equal_eager(strategy, monkeypatch):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(32, 32, 3, padding=1).to(memory_format=torch.channels_last),
                          nn.Flatten(), nn.Linear(32 * 48 * 48, 10))
    x = torch.randn(8, 3, 48, 48)
    to_dropit(model, gamma=0.9, strategy=strategy)
    reseed(1)
    fused = _step_gradients(model, x)
    monkeypatch.setenv('MMDROPIT_FUSED', '0')
    reseed(1)
    eager = _step_gradients(model, x)
    from_dropit(model)
    for got, want in zip(fused, eager):
        assert torch.equal(got, want)


def _run(code: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, '-c', code], cwd=ROOT, capture_output=True, text=True,
                          env={**os.environ, **env}, timeout=300)


CHECK_EAGER = '''
import warnings, torch
from mmdropit.dropit.ops import keep_fixed, unkeep
from mmdropit.kernels import cpu
warnings.simplefilter('always')
x = torch.randn(4000)
tensors, layout = keep_fixed(x, 0.9, 'mink', x.shape, None)
tensors, layout = keep_fixed(x, 0.9, 'mink', x.shape, None)
rebuilt = unkeep(tensors, layout)
assert int(rebuilt.count_nonzero()) == 400 and not cpu.load()
print('eager ok')
'''


def test_missing_build_warns_once_and_runs_eager(tmp_path):
    done = _run(CHECK_EAGER, MMDROPIT_KERNELS_DIR=str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert 'eager ok' in done.stdout
    lines = [line for line in done.stderr.splitlines() if 'fused CPU kernels are not used' in line]
    assert len(lines) == 1 and 'they are not built' in lines[0], done.stderr
    assert 'python -m mmdropit.kernels.cpu.build' in lines[0]


def test_stale_build_is_not_loaded(tmp_path):
    assert fused_cpu.load()
    shutil.copy(library_path(), tmp_path / library_path().name)
    (tmp_path / 'mmdropit_cpu_kernels.stamp').write_text('an older source\n')
    done = _run(CHECK_EAGER, MMDROPIT_KERNELS_DIR=str(tmp_path))
    assert done.returncode == 0, done.stderr
    assert 'for another torch or an older source' in done.stderr


def test_portable_loops_equal_avx512_ones():
    """The loops machines without AVX-512 run give what the AVX-512 forms give (DropIT's
    selections, ``random``'s keys and scaled values too, and the integer codecs)."""
    code = '''
import torch
from mmdropit.kernels import cpu
assert cpu.load()
g = torch.Generator().manual_seed(0)
out = []
for numel in (5, 70_001, 600_003):
    x = torch.randn(numel, generator=g)
    x[::5] = 0
    for kept in (0, numel // 10, numel // 2, numel):
        for bitmask in (True, False):
            first, values = torch.ops.mmdropit_cpu.keep_topk(x, kept, bitmask)
            out += [first, values]
            g = torch.Generator().manual_seed(kept)
            out += list(torch.ops.mmdropit_cpu.keep_random(x, kept, bitmask, 3.0, g))
            if bitmask:
                out.append(torch.ops.mmdropit_cpu.scatter_bitmask(first, values, numel))
    for bits in (4, 2):
        codes = torch.ops.mmdropit_cpu.quantize_low(x, bits, 5)
        out += [*codes, torch.ops.mmdropit_cpu.dequantize_low(*codes, bits, numel, x.dtype)]
    codes = torch.ops.mmdropit_cpu.quantize_int8(x)
    out += [*codes, torch.ops.mmdropit_cpu.dequantize_int8(*codes, x.dtype)]
torch.save(out, OUT)
'''
    results = []
    for flag in ('0', '1'):
        path = ROOT / 'work_dirs' / f'portable_{flag}_{os.getpid()}.pt'
        path.parent.mkdir(exist_ok=True)
        done = _run(code.replace('OUT', repr(str(path))), MMDROPIT_NO_AVX512=flag)
        assert done.returncode == 0, done.stderr
        results.append(torch.load(path))
        path.unlink()
    for fast, portable in zip(*results):
        assert torch.equal(fast, portable)


@pytest.mark.parametrize('dtype', DTYPES, ids=str)
@pytest.mark.parametrize('numel', (1, 9, 70_001))
def test_lean_masks_equal_eager(dtype, numel):
    x = kernel_input(numel, dtype, 'ties') * 3
    x[::11] = float('inf')
    x[5::13] = float('nan')
    x[2::17] = 1.0  # on hardtanh's bound: outside
    grad = kernel_input(numel, dtype, 'normal')
    for low, high, bounded in ((0.0, float('inf'), False), (-1.0, 1.0, True), (0.0, 6.0, True)):
        passes = (x > low) & (x < high) if bounded else x > 0
        bits = torch.ops.mmdropit_cpu.pack_between(x, low, high, bounded)
        assert torch.equal(bits, pack_bits(passes)), (low, high)
        assert torch.equal(torch.ops.mmdropit_cpu.where_bits(grad, bits),
                           torch.where(passes, grad, 0.0))


@pytest.mark.parametrize('dtype', DTYPES, ids=str)
@pytest.mark.parametrize('numel', (1, 9, 70_001))
@pytest.mark.parametrize('kind', ['gelu', 'gelu_tanh', 'silu'])
def test_derivative_codes_and_scaled_gradients_equal_eager(dtype, numel, kind):
    """The lean GELU / SiLU's 4-bit codes (inputs on the boundaries, infinities and NaNs
    included) and the gradient scaled by their table, as the eager path gives them."""
    x = derivative_code_input(numel, dtype, kind)
    grad = kernel_input(numel, dtype, 'scaled')
    table = derivative_table_on(kind, x)
    packed = torch.ops.mmdropit_cpu.bucket_codes(x, table.boundaries)
    with eager_only():
        assert torch.equal(packed, encode_derivatives(x, kind))
        eager_grad = scale_gradient(grad, packed, kind)
    assert torch.equal(torch.ops.mmdropit_cpu.scale_by_codes(grad, packed, table.values),
                       eager_grad)


@pytest.mark.parametrize('inplace', [False, True])
def test_lean_activation_steps_equal_eager(inplace):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3), nn.ReLU(inplace=inplace), nn.Conv2d(16, 16, 3),
                          nn.ReLU6(inplace=inplace), nn.Flatten(), nn.Linear(16 * 28 * 28, 4))
    x = torch.randn(4, 3, 32, 32)
    to_dropit(model, gamma=0.5)
    fused = _step_gradients(model, x)
    with eager_only():
        eager = _step_gradients(model, x)
    from_dropit(model)
    for got, want in zip(fused, eager):
        assert torch.equal(got, want)
