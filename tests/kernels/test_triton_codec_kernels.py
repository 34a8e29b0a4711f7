"""The activation codes' Triton kernels give the eager path's tensors bit for bit: int8 codes,
scales and rebuilt values; 4- and 2-bit minimums, steps and rebuilt values, and the codes of the
CPU kernel's counter-based random numbers for the same seed; the lean activations' 1-bit masks
and masked gradients. Without a GPU they run in Triton's
interpreter on CPU tensors (the root ``conftest.py`` sets ``TRITON_INTERPRET=1``); on a GPU,
compiled on CUDA tensors, where the CUDA-marked tests also run them through the codecs' entry
points and check that nothing waits for the GPU."""
from __future__ import annotations

import os
import shutil

import pytest
import torch

from mmdropit.bench.triton_launches import recorded_launches
from mmdropit.codecs import GROUP
from mmdropit.codecs.derivative_codes import encode, scale_gradient
from mmdropit.codecs.int8 import dequantize, quantize
from mmdropit.codecs.low_bit import dequantize_low, quantize_low, unpack_codes
from mmdropit.dropit.compact import pack_bits, unpack_bits
from mmdropit.kernels import cpu as fused_cpu
from mmdropit.kernels.switch import eager_only
from tests.helpers.kernel_inputs import (KINDS, derivative_code_input, derivative_table_on,
                                         kernel_input)

triton = pytest.importorskip('triton', reason='Triton ships with the CUDA build of torch')

DEVICE = 'cuda' if torch.cuda.is_available() else 'cpu'
DTYPES = (torch.float32, torch.bfloat16, torch.float16)
SIZES = (1, 7, GROUP, 1000, 3001)  # partial groups, one whole group, several programs
SEED = -1_234_567_890_123


@pytest.fixture(scope='module')
def kernels():
    """The kernels' module: compiled on a GPU, interpreted on CPU tensors without one."""
    if DEVICE == 'cpu' and os.environ.get('TRITON_INTERPRET') != '1':
        pytest.skip('no GPU, and Triton was not started in its interpreter (TRITON_INTERPRET=1)')
    from mmdropit.kernels.cuda import codec_kernels
    return codec_kernels


def _seed() -> torch.Tensor:
    return torch.tensor([SEED], dtype=torch.int64, device=DEVICE)


@pytest.mark.parametrize('dtype', DTYPES, ids=str)
@pytest.mark.parametrize('numel', SIZES)
@pytest.mark.parametrize('kind', KINDS)
def test_int8_codes_scales_and_rebuilt_values_equal_eager(kernels, dtype, numel, kind):
    values = kernel_input(numel, dtype, kind, DEVICE)
    codes, scales = kernels.quantize_int8(values)
    with eager_only():
        eager_codes, eager_scales = quantize(values)
        eager_rebuilt = dequantize(eager_codes, eager_scales, dtype)
    assert torch.equal(codes, eager_codes) and torch.equal(scales, eager_scales)
    rebuilt = kernels.dequantize_int8(codes, scales, dtype)
    assert rebuilt.dtype == dtype and torch.equal(rebuilt, eager_rebuilt)


@pytest.mark.parametrize('bits', [4, 2])
@pytest.mark.parametrize('dtype', DTYPES, ids=str)
@pytest.mark.parametrize('numel', SIZES)
@pytest.mark.parametrize('kind', KINDS)
def test_low_bit_groups_and_rebuilt_values_equal_eager(kernels, bits, dtype, numel, kind):
    values = kernel_input(numel, dtype, kind, DEVICE)
    packed, minimums, steps = kernels.quantize_low(values, bits, _seed())
    with eager_only():
        _, eager_minimums, eager_steps = quantize_low(values, bits)
        eager_rebuilt = dequantize_low(packed, minimums, steps, bits, numel, dtype)
    assert torch.equal(minimums, eager_minimums) and torch.equal(steps, eager_steps)
    rebuilt = kernels.dequantize_low(packed, minimums, steps, bits, numel, dtype)
    assert rebuilt.dtype == dtype and torch.equal(rebuilt, eager_rebuilt)


@pytest.mark.skipif(shutil.which('c++') is None, reason='no C++ compiler here')
@pytest.mark.parametrize('bits', [4, 2])
@pytest.mark.parametrize('dtype', DTYPES, ids=str)
@pytest.mark.parametrize('numel', SIZES)
def test_low_bit_codes_equal_the_cpu_kernels_for_the_same_seed(kernels, bits, dtype, numel):
    """The Triton hash of (seed, index) is the C++ one: the same random numbers, the same
    codes, whichever device encodes."""
    assert fused_cpu.load()
    values = kernel_input(numel, dtype, 'normal', DEVICE)
    fused = kernels.quantize_low(values, bits, _seed())
    on_cpu = torch.ops.mmdropit_cpu.quantize_low(values.cpu(), bits, SEED)
    assert all(torch.equal(a.cpu(), b) for a, b in zip(fused, on_cpu))


@pytest.mark.parametrize('bits', [8, 4, 2])
def test_round_trip_error_is_within_a_step(kernels, bits):
    values = kernel_input(3001, torch.float32, 'scaled', DEVICE)
    group_of = torch.arange(values.numel(), device=DEVICE) // GROUP
    if bits == 8:
        codes, scales = kernels.quantize_int8(values)
        rebuilt = kernels.dequantize_int8(codes, scales, torch.float32)
        bound = scales[group_of] / 2 * (1 + 1e-5)  # to the nearest: half a step
    else:
        packed, minimums, steps = kernels.quantize_low(values, bits, _seed())
        rebuilt = kernels.dequantize_low(packed, minimums, steps, bits, values.numel(),
                                         torch.float32)
        bound = steps[group_of] * (1 + 1e-5)  # floor or ceiling: under a step
    assert ((rebuilt - values).abs() <= bound).all()


@pytest.mark.parametrize('bits', [4, 2])
def test_stochastic_rounding_is_unbiased(kernels, bits):
    """Over many seeds, the rebuilt values' mean is the value itself (to a few standard errors
    of the mean of draws each under a step off)."""
    values = kernel_input(320, torch.float32, 'normal', DEVICE)
    draws = 200
    total = torch.zeros_like(values, dtype=torch.float64)
    for seed in range(draws):
        packed, minimums, steps = kernels.quantize_low(
            values, bits, torch.tensor([seed * 7919 + 1], dtype=torch.int64, device=DEVICE))
        total += kernels.dequantize_low(packed, minimums, steps, bits, values.numel(),
                                        torch.float32).double()
    step_of = steps[torch.arange(values.numel(), device=DEVICE) // GROUP].double()
    error = (total / draws - values.double()) / step_of
    assert error.mean().abs() < 0.02  # 320 values: a bias of 0.02 step would be ~7 errors out
    assert error.abs().max() < 0.15   # each: standard error <= 0.5 / sqrt(200) = 0.035


@pytest.mark.parametrize('bits', [4, 2])
def test_each_code_is_a_level_next_to_its_value(kernels, bits):
    values = kernel_input(3001, torch.float32, 'normal', DEVICE)
    packed, minimums, steps = kernels.quantize_low(values, bits, _seed())
    codes = unpack_codes(packed, bits)[:values.numel()].double()
    group_of = torch.arange(values.numel(), device=DEVICE) // GROUP
    levels = (values.double() - minimums.double()[group_of]) / steps.double()[group_of]
    assert ((codes - levels).abs() < 1 + 1e-4).all() and codes.max() <= 2**bits - 1


@pytest.mark.parametrize('dtype', DTYPES, ids=str)
@pytest.mark.parametrize('numel', (1, 9, 1000, 3001))
@pytest.mark.parametrize('bounds', [(0.0, 0.0, False), (-1.0, 1.0, True), (0.1, 6.0, True)])
def test_lean_masks_equal_eager(kernels, dtype, numel, bounds):
    """The 1-bit masks of the lean activations: the bits of ``low < x (< high)``, bounds compared
    in the input's dtype (0.1 is not a bfloat16 or float16 number), and the gradient where a bit
    is set."""
    low, high, bounded = bounds
    x = kernel_input(numel, dtype, 'normal', DEVICE)
    x[::5] = low  # on the bound, as PyTorch rounds it to the dtype
    bits = kernels.pack_between(x, low, high, bounded)
    assert torch.equal(bits, pack_bits((x > low) & (x < high) if bounded else x > low))
    grad = kernel_input(numel, dtype, 'scaled', DEVICE)
    eager = torch.where(unpack_bits(bits, numel), grad, 0.0)
    assert torch.equal(kernels.where_bits(grad, bits), eager)


@pytest.mark.parametrize('dtype', DTYPES, ids=str)
@pytest.mark.parametrize('numel', (1, 9, 1000, 3001))
@pytest.mark.parametrize('kind', ['gelu', 'silu'])
def test_derivative_codes_and_scaled_gradients_equal_eager(kernels, dtype, numel, kind):
    """The lean GELU / SiLU's 4-bit codes (inputs on the boundaries, infinities and NaNs
    included) and the gradient scaled by their table, as the eager path gives them."""
    x = derivative_code_input(numel, dtype, kind, DEVICE)
    grad = kernel_input(numel, dtype, 'scaled', DEVICE)
    packed = kernels.bucket_codes(x, derivative_table_on(kind, x).boundaries)
    with eager_only():
        eager_packed = encode(x, kind)
        eager_grad = scale_gradient(grad, eager_packed, kind)
    assert torch.equal(packed, eager_packed)
    assert torch.equal(kernels.scale_by_codes(grad, packed, derivative_table_on(kind, grad).values),
                       eager_grad)


@pytest.mark.parametrize('dtype', DTYPES, ids=str)
def test_each_call_is_one_launch(kernels, dtype):
    values = kernel_input(3001, dtype, 'normal', DEVICE)
    seed = _seed()
    with recorded_launches(kernels) as encoding:
        codes, scales = kernels.quantize_int8(values)
        packed, minimums, steps = kernels.quantize_low(values, 4, seed)
    with recorded_launches(kernels) as decoding:
        kernels.dequantize_int8(codes, scales, dtype)
        kernels.dequantize_low(packed, minimums, steps, 4, values.numel(), dtype)
    with recorded_launches(kernels) as masking:
        kernels.where_bits(values, kernels.pack_between(values, -1.0, 1.0, True))
    table = derivative_table_on('gelu', values)
    with recorded_launches(kernels) as coding:
        kernels.scale_by_codes(values, kernels.bucket_codes(values, table.boundaries),
                               table.values)
    assert encoding.total == 2, (encoding.triton, encoding.torch_ops)
    assert decoding.total == 2, (decoding.triton, decoding.torch_ops)
    assert masking.total == 2, (masking.triton, masking.torch_ops)
    assert coding.total == 2, (coding.triton, coding.torch_ops)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')
@pytest.mark.parametrize('bits', [8, 4, 2])
def test_the_codecs_take_the_kernels_and_never_wait_for_the_gpu(bits):
    """Through the codecs' entry points (the seed drawn on the device, one launch before the
    kernel): the Triton kernels run, and nothing is read back."""
    from mmdropit.codecs.bits import dequantize_values, quantize_values
    values = kernel_input(70_001, torch.bfloat16, 'normal', 'cuda')
    dequantize_values(quantize_values(values, bits), bits, values.numel(), values.dtype)
    torch.cuda.synchronize()  # compiled before it is watched
    torch.cuda.set_sync_debug_mode('error')
    try:
        rebuilt = dequantize_values(quantize_values(values, bits), bits, values.numel(),
                                    values.dtype)
    finally:
        torch.cuda.set_sync_debug_mode('default')
    with eager_only():
        eager = quantize_values(values, bits)
        eager_rebuilt = dequantize_values(eager, bits, values.numel(), values.dtype)
    if bits == 8:
        assert torch.equal(rebuilt, eager_rebuilt)
    with torch.profiler.profile() as profile:
        quantize_values(values, bits)
    names = ' '.join(event.name for event in profile.events())
    assert ('_quantize_int8_kernel' if bits == 8 else '_quantize_low_kernel') in names
