"""DropIT with ``value_bits=8``: the input and bias gradients stay exact, the weight gradient
is the one of the top-k input with each kept value rounded to its group's int8 step (an
independent re-computation), the bytes are those computed by hand, and it still compiles.
With 4 and 2 bits the weight gradient is unbiased: its mean over many steps is the top-k
input's."""
from __future__ import annotations

import pytest
import torch
import torch._dynamo
from torch import nn

from mmdropit.codecs import GROUP
from mmdropit.codecs.low_bit import low_bit_bytes
from mmdropit.dropit import to_dropit
from mmdropit.errors import ConfigError
from mmdropit.memory import SavedTensorMeter


def _rounded_top_k(x: torch.Tensor, gamma: float, rounded: bool = True) -> torch.Tensor:
    """``x`` with all but its largest-magnitude elements zeroed and (if ``rounded``) each kept
    value rounded to ``max|v| / 127`` steps over groups of ``GROUP`` kept values in memory
    order."""
    flat = x.detach().reshape(-1).clone()
    kept = flat.numel() - round(gamma * flat.numel())
    index = flat.abs().topk(kept).indices.sort().values
    values = flat[index]
    for start in range(0, kept if rounded else 0, GROUP):
        group = values[start:start + GROUP]
        step = group.abs().max() / 127
        values[start:start + GROUP] = torch.round(group / step) * step
    rounded = torch.zeros_like(flat)
    rounded[index] = values
    return rounded.view_as(x)


@pytest.mark.parametrize('layer,shape', [(nn.Linear(96, 40), (16, 7, 96)),
                                         (nn.Conv2d(6, 8, 3, padding=1), (4, 6, 12, 12))])
def test_gradients_with_8_bit_values(layer, shape):
    torch.manual_seed(0)
    x = torch.randn(shape)
    grad_out = torch.randn_like(layer(x))
    x_exact = x.clone().requires_grad_()
    exact_input, exact_bias = torch.autograd.grad(layer(x_exact), (x_exact, layer.bias), grad_out)
    (reference_weight,) = torch.autograd.grad(layer(_rounded_top_k(x, 0.9)), layer.weight,
                                              grad_out)
    to_dropit(layer, gamma=0.9, exclude=[], value_bits=8)
    x_in = x.clone().requires_grad_()
    grad_input, grad_weight, grad_bias = torch.autograd.grad(
        layer(x_in), (x_in, layer.weight, layer.bias), grad_out)
    torch.testing.assert_close(grad_input, exact_input, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad_bias, exact_bias, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad_weight, reference_weight, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize('bits', [4, 2])
def test_low_bit_values_give_an_unbiased_weight_gradient(bits):
    """One step's weight gradient errs (relative norm) by 7% in 4 bits and 42% in 2 bits; the
    error of the mean of 300 steps' falls as the square root of their count."""
    torch.manual_seed(0)
    layer = nn.Linear(96, 40)
    x = torch.randn(16, 7, 96)
    grad_out = torch.randn(16, 7, 40)
    x_exact = x.clone().requires_grad_()
    exact_input, exact_bias = torch.autograd.grad(layer(x_exact), (x_exact, layer.bias), grad_out)
    (reference,) = torch.autograd.grad(layer(_rounded_top_k(x, 0.9, rounded=False)),
                                       layer.weight, grad_out)
    to_dropit(layer, gamma=0.9, exclude=[], value_bits=bits)
    steps = []
    for _ in range(300):
        x_in = x.clone().requires_grad_()
        grad_input, grad_weight, grad_bias = torch.autograd.grad(
            layer(x_in), (x_in, layer.weight, layer.bias), grad_out)
        steps.append(grad_weight)
    torch.testing.assert_close(grad_input, exact_input, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(grad_bias, exact_bias, rtol=1e-5, atol=1e-6)
    one_error = (steps[0] - reference).norm() / reference.norm()
    mean_error = (torch.stack(steps).mean(0) - reference).norm() / reference.norm()
    assert 0.01 < one_error < {4: 0.15, 2: 0.6}[bits]  # measured 0.074 and 0.42
    assert mean_error < 2 * one_error / len(steps)**0.5  # falls as 1 / sqrt(steps): no bias


@pytest.mark.parametrize('bits', [4, 2])
def test_low_bit_saved_bytes_are_bitmask_codes_and_group_parameters(bits):
    layer = to_dropit(nn.Linear(256, 64), gamma=0.9, exclude=[], value_bits=bits)
    with SavedTensorMeter(layer) as meter:
        layer(torch.randn(32, 256, requires_grad=True)).sum().backward()
    numel = 32 * 256
    kept = numel - round(0.9 * numel)
    groups = -(-kept // GROUP)
    assert meter.result.by_dtype == {'uint8': numel // 8 + groups * GROUP * bits // 8,
                                     'float32': groups * 8}
    assert meter.result.total_bytes == numel // 8 + low_bit_bytes(kept, bits)


def test_saved_bytes_are_bitmask_codes_and_scales():
    layer = to_dropit(nn.Linear(256, 64), gamma=0.9, exclude=[], value_bits=8)
    with SavedTensorMeter(layer) as meter:
        layer(torch.randn(32, 256, requires_grad=True)).sum().backward()
    numel = 32 * 256
    kept = numel - round(0.9 * numel)
    scales = -(-kept // GROUP)
    assert meter.result.by_dtype == {'uint8': numel // 8, 'int8': kept, 'float32': scales * 4}
    assert meter.result.total_bytes / (numel * 4) < 0.06  # 0.13 with float32 values


@pytest.mark.parametrize('bits', [8, 4])
def test_a_quantized_dropit_model_is_one_graph(bits):
    model = to_dropit(nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 10)),
                      gamma=0.9, exclude=[], value_bits=bits)
    explained = torch._dynamo.explain(lambda x: model(x).sum())(torch.randn(32, 64))
    assert explained.graph_break_count == 0, explained.break_reasons


def test_other_value_bits_are_a_clear_error():
    with pytest.raises(ConfigError, match=r'value_bits \(or None\) takes 8 .*, 4 or 2 .*; got 3'):
        to_dropit(nn.Linear(4, 4), exclude=[], value_bits=3)
