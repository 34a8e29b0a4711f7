"""DropIT's Triton kernels give bit-identical tensors to the eager path. Without a GPU they run
in Triton's interpreter on CPU tensors (the root ``conftest.py`` sets ``TRITON_INTERPRET=1``);
on a GPU, compiled on CUDA tensors, and the CUDA-marked test runs them through DropIT's layers."""
from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from mmdropit import from_dropit, to_dropit
from mmdropit.common.random_source import reseed
from mmdropit.dropit.compact import encode, pack_bits, scatter_kept
from mmdropit.dropit.strategies import kept_count, mink, sampled_threshold
from mmdropit.kernels.switch import eager_only
from tests.helpers.kernel_inputs import KINDS, kernel_input

triton = pytest.importorskip('triton', reason='Triton ships with the CUDA build of torch')

DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
BRACKETED = 140_001  # > 8 * SAMPLE: the sampled bracket; smaller sizes: kthvalue on everything
# The interpreter takes seconds per pass over the bracketed size: there it runs in float32 only
# (and in bfloat16 on the 'scaled' input below); on a GPU in every dtype.
CASES = [(dtype, numel) for dtype in DTYPES for numel in (1, 7, 1000, 3001)] + [
    (dtype, BRACKETED) for dtype in (DTYPES if DEVICE == 'cuda' else DTYPES[:1])]


@pytest.fixture(scope='module')
def kernels():
    """The kernels' module: compiled on a GPU, interpreted on CPU tensors without one."""
    if DEVICE == 'cpu' and os.environ.get('TRITON_INTERPRET') != '1':
        pytest.skip('no GPU, and Triton was not started in its interpreter (TRITON_INTERPRET=1)')
    from mmdropit.kernels.cuda import dropit_kernels
    return dropit_kernels


@pytest.mark.parametrize('dtype, numel', CASES, ids=str)
@pytest.mark.parametrize('kind', KINDS)
def test_keep_topk_equals_eager_mink(kernels, dtype, numel, kind):
    x = kernel_input(numel, dtype, kind, DEVICE)
    for gamma in (0.0, 0.5, 0.9, 0.99):
        kept = kept_count(numel, gamma)
        keep, _ = mink(x, gamma)
        for encoding in ('bitmask', 'indices'):
            eager = encode(x, keep, 1.0, encoding)
            fused = kernels.keep_topk(x, kept, encoding == 'bitmask')
            assert torch.equal(fused[0], eager[0]), (gamma, encoding)
            assert torch.equal(fused[1], eager[1]), (gamma, encoding)


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16], ids=str)
def test_bracketed_threshold_in_half_precision(kernels, dtype):
    x = kernel_input(BRACKETED, dtype, 'scaled', DEVICE)
    keep, _ = mink(x, 0.9)
    bits, values = kernels.keep_topk(x, kept_count(x.numel(), 0.9), True)
    assert torch.equal(bits, pack_bits(keep)) and torch.equal(values, x[keep])


def test_bracket_finds_the_threshold_without_a_full_selection(kernels, monkeypatch):
    def no_full_selection(flat, rank):
        raise AssertionError('the bracket missed on ordinary data')

    monkeypatch.setattr(kernels, '_kth_magnitude', no_full_selection)
    x = kernel_input(BRACKETED, torch.float32, 'normal', DEVICE)
    keep, _ = mink(x, 0.9)
    bits, values = kernels.keep_topk(x, kept_count(x.numel(), 0.9), True)
    assert torch.equal(bits, pack_bits(keep)) and torch.equal(values, x[keep])


def test_bracket_that_misses_falls_back_to_the_exact_threshold(kernels, monkeypatch):
    """A sample that brackets the wrong place (forced here) still gives the exact min-k."""
    x = kernel_input(BRACKETED, torch.float32, 'scaled', DEVICE)
    keep, _ = mink(x, 0.9)
    monkeypatch.setattr(kernels, '_sampled_magnitudes',
                        lambda flat: torch.linspace(0, 1e-9, kernels.SAMPLE, device=DEVICE))
    bits, values = kernels.keep_topk(x, kept_count(x.numel(), 0.9), True)
    assert torch.equal(bits, pack_bits(keep)) and torch.equal(values, x[keep])


@pytest.mark.parametrize('dtype', DTYPES, ids=str)
@pytest.mark.parametrize('gamma', (0.5, 0.9))
def test_above_threshold_equals_eager_mink_approx(kernels, dtype, gamma):
    x = kernel_input(BRACKETED, dtype, 'scaled', DEVICE)
    reseed(3)
    threshold = float(sampled_threshold(x, gamma))
    keep = x.abs() > threshold
    counts = kernels.above_counts(x, threshold)
    assert int(counts.sum()) == int(keep.sum())
    for encoding in ('bitmask', 'indices'):
        fused = kernels.write_above(x, threshold, counts, encoding == 'bitmask')
        eager = encode(x, keep, 1.0, encoding)
        assert torch.equal(fused[0], eager[0]) and torch.equal(fused[1], eager[1])


@pytest.mark.parametrize('dtype', DTYPES, ids=str)
@pytest.mark.parametrize('numel', (1, 9, 1000, BRACKETED))
def test_scatter_bitmask_equals_eager(kernels, dtype, numel):
    x = kernel_input(numel, dtype, 'normal', DEVICE)
    keep, _ = mink(x, 0.9)
    bits, values = encode(x, keep, 1.0, 'bitmask')
    with eager_only():
        eager = scatter_kept(bits, values, numel, 'bitmask')
    fused = kernels.scatter_bitmask(bits, values, numel)
    assert torch.equal(fused, eager)
    assert torch.equal(fused[keep], x[keep]) and not fused[~keep].any()


def _step_gradients(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad()
    model(x).square().mean().backward()
    return [p.grad.clone() for p in model.parameters()]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')
@pytest.mark.parametrize('strategy', ['mink', 'mink_approx'])
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16], ids=str)
def test_training_step_on_the_gpu_equals_eager(strategy, dtype):
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.ReLU(),
                          nn.Conv2d(32, 32, 3, padding=1).to(memory_format=torch.channels_last),
                          nn.Flatten(), nn.Linear(32 * 48 * 48, 10)).cuda().to(dtype)
    x = torch.randn(8, 3, 48, 48, device='cuda', dtype=dtype)
    to_dropit(model, gamma=0.9, strategy=strategy)
    reseed(1)
    fused = _step_gradients(model, x)
    reseed(1)
    with eager_only():
        eager = _step_gradients(model, x)
    from_dropit(model)
    for got, want in zip(fused, eager):
        assert torch.equal(got, want)
