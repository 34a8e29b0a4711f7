"""The integer codecs' per-group parameters follow their documented formula bit for bit: the int8
scale is ``max|v| * float32(1 / 127)`` and the 4/2-bit step ``(max - min) * float32(1 / L)``
with ``L = 2**bits - 1``, a product by the float32 reciprocal rather than a quotient. PyTorch
divides a CUDA tensor by a number with its reciprocal and a CPU tensor exactly, so only the
product written out keeps the eager path on both devices, the C++ and the Triton kernels alike
(a GPU run found the Triton scales one ulp off CUDA's eager ones while they divided). The values
are chosen so that the quotient and the product differ in some groups: a codec that divided
again would fail here."""
from __future__ import annotations

import pytest
import torch

from mmdropit.codecs import GROUP
from mmdropit.codecs.int8 import quantize
from mmdropit.codecs.low_bit import quantize_low
from mmdropit.kernels.switch import eager_only

GROUPS = 512


def _values() -> torch.Tensor:
    generator = torch.Generator().manual_seed(0)
    spread = torch.logspace(-3, 3, GROUPS).repeat_interleave(GROUP)
    return torch.randn(GROUPS * GROUP, generator=generator) * spread


def _reciprocal(levels: int) -> torch.Tensor:
    return torch.tensor(1 / levels, dtype=torch.float32)


def test_the_int8_scale_is_the_largest_magnitude_times_the_float32_reciprocal_of_127():
    values = _values()
    largest = values.view(-1, GROUP).abs().amax(1)
    with eager_only():
        _, scales = quantize(values)
    assert torch.equal(scales, largest * _reciprocal(127))
    assert not torch.equal(scales, largest / 127)  # the test tells the two apart


@pytest.mark.parametrize('bits', [4, 2])
def test_the_low_bit_step_is_the_range_times_the_float32_reciprocal_of_the_levels(bits):
    values = _values()
    groups = values.view(-1, GROUP)
    spread = groups.amax(1) - groups.amin(1)
    levels = 2**bits - 1
    with eager_only():
        _, minimums, steps = quantize_low(values, bits)
    assert torch.equal(minimums, groups.amin(1))
    assert torch.equal(steps, spread * _reciprocal(levels))
    assert not torch.equal(steps, spread / levels)  # the test tells the two apart
