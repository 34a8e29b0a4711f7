"""DropIT's Triton kernels give bit-identical tensors to the eager path. Without a GPU they run
in Triton's interpreter on CPU tensors (the root ``conftest.py`` sets ``TRITON_INTERPRET=1``);
on a GPU, compiled on CUDA tensors, and the CUDA-marked test runs them through DropIT's layers."""
from __future__ import annotations

import os

import pytest
import torch
from torch import nn

from mmdropit import from_dropit, to_dropit
from mmdropit.bench.triton_launches import recorded_launches
from mmdropit.common.random_source import reseed
from mmdropit.dropit.compact import encode, pack_bits, scatter_kept
from mmdropit.dropit.strategies import kept_count, mink, random_scale, sampled_threshold
from mmdropit.kernels.cuda.histogram_workspace import zeroed_histograms
from mmdropit.kernels.switch import eager_only
from tests.helpers.drawn_keys import drawn_keys
from tests.helpers.kernel_inputs import KINDS, kernel_input

triton = pytest.importorskip('triton', reason='Triton ships with the CUDA build of torch')

DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
BRACKETED = 140_001  # many blocks (and, for the eager mink, its sampled bracket)
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


RANDOM_CASES = [(torch.float32, 1), (torch.float32, 1000), (torch.bfloat16, 3001),
                (torch.float16, 3001), (torch.float32, 9 * 4096 + 5)]


@pytest.mark.parametrize('dtype, numel', RANDOM_CASES, ids=str)
def test_keep_random_keeps_the_largest_drawn_keys(kernels, dtype, numel):
    """``random``'s kernels keep the elements of the largest keys computed apart (NumPy), ties
    first in memory order, the values times the scale rounded as the eager product, in both
    encodings; a negative seed is read as its 64-bit pattern."""
    x = kernel_input(numel, dtype, 'normal', DEVICE)
    for seed in (-0x123456789ABCDEF, 5):
        for gamma in (0.0, 0.5, 0.9, 0.99):
            kept = kept_count(numel, gamma)
            scale = random_scale(numel, kept)
            keep, _ = mink(drawn_keys(seed, numel).to(DEVICE), gamma)
            on_device = torch.tensor([seed], device=DEVICE)
            for encoding in ('bitmask', 'indices'):
                eager = encode(x, keep, scale, encoding)
                fused = kernels._keep_largest(x, kept, encoding == 'bitmask', on_device, scale)
                assert torch.equal(fused[0], eager[0]), (seed, gamma, encoding)
                assert torch.equal(fused[1], eager[1]), (seed, gamma, encoding)


def test_keep_random_draws_its_seed_from_the_generator_it_is_given(kernels):
    x = kernel_input(5000, torch.float32, 'normal', DEVICE)
    draws = [kernels.keep_random(x, 500, True, 10.0, torch.Generator(DEVICE).manual_seed(seed))
             for seed in (3, 3, 4)]
    assert torch.equal(draws[0][0], draws[1][0]) and not torch.equal(draws[0][0], draws[2][0])
    everything = kernels.keep_random(x, x.numel(), True, 2.0, None)  # scaled as the CPU's
    assert torch.equal(everything[1], x * 2.0)


@pytest.mark.parametrize('inputs', ['ties', 'all_equal'])
def test_chunked_passes_with_more_blocks_than_programs(kernels, monkeypatch, inputs):
    """Three programs over 9 blocks (the last one partial): chunks of three blocks, with ties
    on both sides of every chunk border, kept from one element to all of them."""
    monkeypatch.setattr(kernels, 'PROGRAMS', 3)
    numel = 8 * kernels.BLOCK + 5
    if inputs == 'ties':  # magnitudes 2, 1, 0, 1, 2 repeating: every kept count cuts ties
        x = (torch.arange(numel, device=DEVICE) % 5 - 2).to(torch.float32)
    else:
        x = torch.full((numel,), -0.25, device=DEVICE)
    for gamma in (0.0, 0.5, 0.7, 1 - 1.5 / numel):  # the last keeps one element
        kept = kept_count(numel, gamma)
        keep_eager, _ = mink(x, gamma)
        bits, values = kernels.keep_topk(x, kept, True)
        indices, same_values = kernels.keep_topk(x, kept, False)
        assert int(keep_eager.sum()) == kept, kept
        assert torch.equal(bits, pack_bits(keep_eager)), kept
        assert torch.equal(values, x[keep_eager]) and torch.equal(same_values, values), kept
        assert torch.equal(indices.long(), keep_eager.nonzero().flatten()), kept


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16], ids=str)
def test_bracketed_threshold_in_half_precision(kernels, dtype):
    x = kernel_input(BRACKETED, dtype, 'scaled', DEVICE)
    keep, _ = mink(x, 0.9)
    bits, values = kernels.keep_topk(x, kept_count(x.numel(), 0.9), True)
    assert torch.equal(bits, pack_bits(keep)) and torch.equal(values, x[keep])


def _neighbours(value: float, count: int) -> torch.Tensor:
    """``count`` float32 numbers from ``value`` up, one unit in the last place apart: their bit
    patterns differ in the lowest byte (or two)."""
    start = torch.tensor([value], dtype=torch.float32).view(torch.int32)
    return (start + torch.arange(count, dtype=torch.int32)).view(torch.float32)


def _fresh_histograms(kernels, x: torch.Tensor) -> torch.Tensor:
    """Zeroed histograms of their own for a direct ``_select`` (the cached workspace is left
    filled by it: only ``keep_topk``'s write zeroes it)."""
    return torch.zeros(kernels._WORKSPACE_INTS, dtype=torch.int32, device=x.device)


@pytest.mark.parametrize('case', ['ulps', 'ties', 'specials'])
def test_the_radix_select_finds_the_exact_kth_magnitude(kernels, case):
    """Ranks that fall between bit patterns differing in any byte, ties across blocks, zeros
    of both signs, subnormals and infinities: the threshold is ``kthvalue``'s, bit for bit."""
    generator = torch.Generator().manual_seed(0)
    x = {'ulps': torch.cat([_neighbours(1.0, 700), -_neighbours(1.0, 700),
                            _neighbours(3e-3, 300), _neighbours(2.0**40, 300)]),
         'ties': torch.full((5000,), -0.25).index_fill(0, torch.arange(0, 5000, 7), 0.5),
         'specials': torch.tensor([0.0, -0.0, 1e-45, -1e-45, 1e-40, float('inf'),
                                   float('-inf'), 3.0e38] * 300)}[case]
    x = x[torch.randperm(x.numel(), generator=generator)].to(DEVICE)
    for rank in sorted({1, 2, x.numel() // 3, x.numel() // 2, x.numel() - 1, x.numel()}):
        found = kernels._select(x, rank, _fresh_histograms(kernels, x))[0]
        assert found.dtype == torch.float32 and found.shape == (1,)
        assert torch.equal(found.view(torch.int32), x.abs().kthvalue(rank).values.reshape(1)
                           .view(torch.int32)), rank


@pytest.mark.parametrize('programs', [1, 2112], ids=['one-program', 'a-program-a-block'])
def test_the_later_passes_skip_blocks_where_nothing_matches_and_stay_exact(kernels, programs,
                                                                            monkeypatch):
    """Neighbouring float32 bit patterns fill one block, between blocks of far smaller and far
    larger magnitudes: where the threshold lies among the neighbours, the third and fourth
    passes match in that block alone and skip the others, whose elements must then not be
    taken off the histograms either (visible where a program walks several blocks, as on
    inputs of more than ``PROGRAMS`` blocks)."""
    monkeypatch.setattr(kernels, 'PROGRAMS', programs)
    block = kernels.BLOCK
    x = torch.cat([torch.full((2 * block,), 1e-3), _neighbours(1.0, block),
                   torch.full((block,), -1e3)]).to(DEVICE)
    for rank in (5, 2 * block + 1, 2 * block + 777, 3 * block - 1, 3 * block, 4 * block):
        found = kernels._select(x, rank, _fresh_histograms(kernels, x))[0]
        assert torch.equal(found.view(torch.int32), x.abs().kthvalue(rank).values.reshape(1)
                           .view(torch.int32)), rank


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16], ids=str)
def test_half_precision_needs_fewer_radix_passes(kernels, dtype):
    """A bfloat16 magnitude sets only the upper two bytes of its float32 pattern, a float16 the
    upper three: two and three passes find the exact threshold (one pass fewer would not)."""
    x = kernel_input(20_000, dtype, 'scaled', DEVICE)
    magnitudes = x.float().abs()
    for rank in (1, 777, 10_000, 19_999, 20_000):
        found = kernels._select(x, rank, _fresh_histograms(kernels, x))[0]
        assert torch.equal(found, magnitudes.kthvalue(rank).values.reshape(1)), rank


@pytest.mark.parametrize('dtype', [torch.bfloat16, torch.float16], ids=str)
def test_nans_and_infinities_are_kept_as_the_eager_path_keeps_them(kernels, dtype):
    """A skipped fp16 step's activations hold infinities and NaNs. The eager ``mink`` keeps the
    infinities and drops the NaNs, which no comparison keeps; so do the kernels: the radix
    select's last pass counts what lies above in the upper bytes by bit pattern, and leaves
    NaNs out of that count as the write's float comparison leaves them out (counted in, the
    chunks after one would start late, leaving holes)."""
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(20_000, generator=generator)
    x[torch.randperm(x.numel(), generator=generator)[:300]] = float('nan')
    x[torch.randperm(x.numel(), generator=generator)[:200]] = float('inf')
    x = x.to(dtype).to(DEVICE)
    for gamma in (0.5, 0.9):
        keep, _ = mink(x, gamma)
        bits, values = kernels.keep_topk(x, kept_count(x.numel(), gamma), True)
        assert torch.equal(bits, pack_bits(keep)), gamma
        assert torch.equal(values[:int(keep.sum())], x[keep]), gamma


# Kernel launches per call: a GPU step of a host-bound model pays every one of them in host time
# (the first GPU run spent ~24 launches on each DropIT layer's selection)
# (now one pass per byte and the write: the write leaves the histograms zero, and the last pass
# counts what each chunk keeps)
SELECT_LAUNCHES = {torch.float32: 5, torch.float16: 4, torch.bfloat16: 3}


@pytest.mark.parametrize('dtype', DTYPES, ids=str)
def test_each_call_launches_few_kernels(kernels, dtype):
    x = kernel_input(20_000, dtype, 'normal', DEVICE)
    kernels.keep_topk(x, 2_000, True)  # the histogram workspace, allocated once a stream
    with recorded_launches(kernels) as selecting:
        bits, values = kernels.keep_topk(x, 2_000, True)
    with recorded_launches(kernels) as rebuilding:
        kernels.scatter_bitmask(bits, values, x.numel())
    assert selecting.total <= SELECT_LAUNCHES[dtype], (selecting.triton, selecting.torch_ops)
    assert rebuilding.total <= 2, (rebuilding.triton, rebuilding.torch_ops)
    with recorded_launches(kernels) as drawing:
        kernels.keep_random(x, 2_000, True, 10.0, None)
    # the seed's draw, four passes over 30-bit keys (whatever the dtype), the write
    assert drawing.total <= 6, (drawing.triton, drawing.torch_ops)


def test_the_histogram_workspace_is_left_zero_for_the_next_call(kernels):
    """``keep_topk`` keeps the radix select's histograms in a cached workspace that its write
    kernel zeroes: after every call it is all zero (and the same tensor), and calls in a row on
    different inputs and dtypes (more passes, then fewer) each equal the eager ``mink``."""
    workspace = None
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.float32):
        for kind in ('normal', 'scaled'):
            x = kernel_input(3001, dtype, kind, DEVICE)
            for gamma in (0.5, 0.9):
                keep, _ = mink(x, gamma)
                bits, values = kernels.keep_topk(x, kept_count(x.numel(), gamma), True)
                assert torch.equal(bits, pack_bits(keep)), (dtype, kind, gamma)
                assert torch.equal(values, x[keep]), (dtype, kind, gamma)
                cached = zeroed_histograms(x.device, kernels._WORKSPACE_INTS)
                assert workspace is None or cached is workspace
                workspace = cached
                assert cached.dtype == torch.int32 and cached.numel() == kernels._WORKSPACE_INTS
                assert not cached.any(), (dtype, kind, gamma, cached.nonzero().flatten()[:8])


def test_a_failed_call_leaves_no_stale_histograms(kernels, monkeypatch):
    """A call that stops after its histogram passes (here its write launch fails) drops the
    filled workspace: the next call takes a zeroed one and equals the eager ``mink``."""
    x = kernel_input(3001, torch.float32, 'normal', DEVICE)
    kept = kept_count(x.numel(), 0.9)
    before = zeroed_histograms(x.device, kernels._WORKSPACE_INTS)

    def failing_write(*args, **kwargs):
        raise RuntimeError('launch failed')
    monkeypatch.setattr(kernels, '_write', failing_write)
    with pytest.raises(RuntimeError, match='launch failed'):
        kernels.keep_topk(x, kept, True)
    monkeypatch.undo()
    assert before.any()  # filled by the histogram passes, and no longer cached
    after = zeroed_histograms(x.device, kernels._WORKSPACE_INTS)
    assert after is not before and not after.any()
    keep, _ = mink(x, 0.9)
    bits, values = kernels.keep_topk(x, kept, True)
    assert torch.equal(bits, pack_bits(keep)) and torch.equal(values, x[keep])


def test_selections_of_everything_and_of_nothing_leave_the_workspace_zero(kernels):
    """Every element kept (an empty input too) makes no histogram; none kept, four."""
    for numel in (0, 1, 1000):
        x = kernel_input(max(numel, 1), torch.float32, 'normal', DEVICE)[:numel]
        for kept in {0, numel}:
            bits, values = kernels.keep_topk(x, kept, True)
            assert values.numel() == kept and int(bits.numel()) == (numel + 7) // 8
            assert not zeroed_histograms(x.device, kernels._WORKSPACE_INTS).any(), (numel, kept)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')
@pytest.mark.parametrize('bitmask', [True, False])
def test_keep_topk_never_waits_for_the_gpu(kernels, bitmask):
    x = kernel_input(BRACKETED, torch.float32, 'normal', DEVICE)
    kernels.keep_topk(x, kept_count(x.numel(), 0.9), bitmask)  # compiled before it is watched
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode('error')
    try:
        kernels.keep_topk(x, kept_count(x.numel(), 0.9), bitmask)
    finally:
        torch.cuda.set_sync_debug_mode('default')


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


def test_chunked_scatter_with_more_blocks_than_programs(kernels, monkeypatch):
    """Three programs over 9 blocks (the last one partial): each chunk's first value follows
    the popcounts of the chunks before it."""
    monkeypatch.setattr(kernels, 'PROGRAMS', 3)
    numel = 8 * kernels.BLOCK + 5
    x = kernel_input(numel, torch.float32, 'normal', DEVICE)
    for gamma in (0.0, 0.9, 1 - 1.5 / numel):
        keep, _ = mink(x, gamma)
        bits, values = encode(x, keep, 1.0, 'bitmask')
        with eager_only():
            eager = scatter_kept(bits, values, numel, 'bitmask')
        assert torch.equal(kernels.scatter_bitmask(bits, values, numel), eager), gamma


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
