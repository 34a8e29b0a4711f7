"""The 4- and 2-bit codecs: each value within one step of its group, stochastic rounding without
bias (a rounding to the nearest level would fail), the bytes as computed by hand, bf16 values,
and the global random stream left alone."""
from __future__ import annotations

import contextlib

import pytest
import torch

from mmdropit.codecs import GROUP
from mmdropit.codecs.bits import dequantize_values, quantize_values, quantized_values_bytes
from mmdropit.codecs.low_bit import dequantize_low, low_bit_bytes, quantize_low
from mmdropit.kernels.switch import eager_only


def _values(numel: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    spread = torch.linspace(0.01, 100, numel)
    return (torch.randn(numel, generator=generator) * spread + spread).to(dtype)


@pytest.mark.parametrize('bits', [4, 2])
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
@pytest.mark.parametrize('numel', [7, GROUP, 1000, (1 << 18) + 37])
def test_round_trip_is_within_one_step_of_each_group(bits, dtype, numel):
    values = _values(numel, dtype)
    before = values.clone()
    packed, minimums, steps = quantize_low(values, bits)
    assert torch.equal(values, before)  # the input is left as it was
    assert packed.dtype == torch.uint8
    assert packed.numel() + 4 * (minimums.numel() + steps.numel()) == low_bit_bytes(numel, bits)
    rebuilt = dequantize_low(packed, minimums, steps, bits, numel, dtype)
    assert rebuilt.dtype == dtype and rebuilt.shape == values.shape
    step = steps.repeat_interleave(GROUP)[:numel]
    error = (rebuilt.float() - values.float()).abs()
    # bf16 rounds the rebuilt value, which is up to a step above the input
    slack = 1e-5 if dtype == torch.float32 else 1e-2 * torch.maximum(values.float().abs(),
                                                                      rebuilt.float().abs())
    assert (error <= step + slack).all()


@pytest.mark.parametrize('path', ['fused', 'eager'])
@pytest.mark.parametrize('bits', [4, 2])
def test_stochastic_rounding_is_unbiased(bits, path):
    """The mean over 4000 draws lies within 5 standard errors of each value, and much nearer
    than rounding to the nearest level would put it, on the fused kernels' path (their hashed
    uniform numbers) and on the eager one (the generator's)."""
    values = _values(256)
    draws = 4000
    total = torch.zeros(256, dtype=torch.float64)
    with eager_only() if path == 'eager' else contextlib.nullcontext():
        for _ in range(draws):
            total += dequantize_values(quantize_values(values, bits), bits, 256, torch.float32)
    mean = total / draws
    _, minimums, steps = quantize_low(values, bits)
    step = steps.repeat_interleave(GROUP).double()
    assert ((mean - values).abs() <= 5 * step / 2 / draws**0.5).all()
    levels = (values.double() - minimums.repeat_interleave(GROUP)) / step
    nearest_error = (levels - levels.round()).abs() * step
    assert (mean - values).abs().mean() < 0.1 * nearest_error.mean()


def test_the_global_random_stream_is_left_alone():
    values = torch.randn(1000)
    before = torch.get_rng_state()
    quantize_low(values, 4)
    assert torch.equal(torch.get_rng_state(), before)


def test_bytes_per_value():
    numel = 1 << 20
    assert quantized_values_bytes(numel, 8) / (4 * numel) == pytest.approx(0.281, abs=1e-3)
    assert quantized_values_bytes(numel, 4) / (4 * numel) == pytest.approx(0.1875)
    assert quantized_values_bytes(numel, 2) / (4 * numel) == pytest.approx(0.125)
