"""Lean GELU / SiLU: the forward pass exact, the input gradient that of the piecewise-constant
derivative (checked against the table, computed independently with ``torch.bucketize``), 4-bit
codes as the only saved tensor, and the conversion undone."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from mmdropit.codecs import compress_activations, restore_activations
from mmdropit.codecs.derivative_codes import LEVELS, derivative_table, lean_activation
from mmdropit.memory import SavedTensorMeter

EXACT = {'gelu': F.gelu, 'gelu_tanh': lambda x: F.gelu(x, approximate='tanh'), 'silu': F.silu}


@pytest.mark.parametrize('kind', list(EXACT))
def test_the_table_fits_the_derivative(kind):
    table = derivative_table(kind)
    assert table.boundaries.numel() == LEVELS - 1
    assert (table.boundaries.diff() > 0).all()
    assert table.rms_error < 0.03
    x = torch.linspace(-4, 4, 801, requires_grad=True)
    (slope,) = torch.autograd.grad(EXACT[kind](x).sum(), x)
    approx = table.values[torch.bucketize(x.detach(), table.boundaries)]
    assert (approx - slope).abs().max() < 0.12


@pytest.mark.parametrize('kind', list(EXACT))
@pytest.mark.parametrize('shape', [(64, 96), (3, 5, 7)])  # an odd count of elements too
def test_forward_exact_and_gradient_from_the_table(kind, shape):
    derivative_table.cache_clear()  # the table is then computed inside the Function's forward
    torch.manual_seed(0)
    x = (torch.randn(shape) * 2).requires_grad_()
    grad_out = torch.randn(shape)
    y = lean_activation(x, kind)
    assert torch.equal(y, EXACT[kind](x))
    (grad,) = torch.autograd.grad(y, x, grad_out)
    table = derivative_table(kind)
    expected = grad_out * table.values[torch.bucketize(x.detach(), table.boundaries)]
    torch.testing.assert_close(grad, expected)
    (exact,) = torch.autograd.grad(EXACT[kind](x), x, grad_out)
    assert (grad - exact).norm() < 0.05 * exact.norm()


def test_a_converted_mlp_saves_half_a_byte_per_gelu_input():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64), nn.SiLU(),
                        nn.Linear(64, 4))
    x = torch.randn(32, 64)
    converted = compress_activations(net, types=(nn.GELU, nn.SiLU), lean_activations=True)
    assert converted == ['1', '3'] and type(net[1]).__name__ == 'LeanGELU'
    with SavedTensorMeter(net) as meter:
        net(x).sum().backward()
    linear_inputs = (32 * 64 + 32 * 256 + 32 * 64) * 4
    assert meter.result.by_dtype['uint8'] == (32 * 256 + 32 * 64) // 2
    assert meter.result.total_bytes == linear_inputs + (32 * 256 + 32 * 64) // 2
    assert restore_activations(net) == ['1', '3'] and type(net[1]) is nn.GELU
