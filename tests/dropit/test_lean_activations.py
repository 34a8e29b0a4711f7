"""Lean activations: same outputs and gradients as PyTorch's, 1 bit kept, conv input freed."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from mmdropit.dropit import from_dropit, to_dropit
from mmdropit.memory import SavedTensorMeter

ACTIVATIONS = [nn.ReLU(), nn.ReLU(inplace=True), nn.ReLU6(), nn.ReLU6(inplace=True),
               nn.Hardtanh(-0.5, 0.7), nn.LeakyReLU(0.2), nn.LeakyReLU(0.1, inplace=True)]


@pytest.mark.parametrize('activation', ACTIVATIONS, ids=repr)
def test_lean_activation_matches_pytorch(activation):
    torch.manual_seed(0)
    x = torch.randn(4, 6, 5, 5) * 4
    x[0, 0, 0, :4] = torch.tensor([0.0, 6.0, -0.5, 0.7])  # on the boundaries
    grad_out = torch.randn_like(x)
    plain_in = x.clone().requires_grad_()
    plain_out = activation(plain_in * 1.0)  # "* 1.0": in-place activations need a non-leaf
    plain_out.backward(grad_out)
    net = to_dropit(nn.Sequential(nn.Linear(5, 5), activation), exclude=[])
    assert type(net[1]).__name__.startswith('Lean') and isinstance(net[1], type(activation))
    lean_in = x.clone().requires_grad_()
    lean_out = net[1](lean_in * 1.0)
    lean_out.backward(grad_out)
    from_dropit(net)
    assert type(net[1]) is type(activation)
    assert torch.equal(lean_out, plain_out) and torch.equal(lean_in.grad, plain_in.grad)


def test_lean_relu_keeps_one_bit_per_element():
    relu = to_dropit(nn.Sequential(nn.Linear(4, 4), nn.ReLU()), layers=['0'], exclude=[])[1]
    x = torch.randn(64, 128, requires_grad=True)
    with SavedTensorMeter() as meter:
        relu(x * 1.0)
    assert meter.result.by_dtype == {'uint8': 64 * 128 // 8}


def _conv_block() -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
                         nn.Conv2d(16, 16, 3, padding=1))


def test_lean_relu_frees_the_conv_input():
    torch.manual_seed(0)
    x = torch.randn(4, 8, 16, 16)
    relu_output = 4 * 16 * 16 * 16 * 4  # bytes of the second conv's input (fp32)
    saved = {}
    for name, lean in (('baseline', None), ('dropit', False), ('dropit+lean', True)):
        net = _conv_block()
        if lean is not None:
            to_dropit(net, gamma=0.9, exclude=['0'], lean_activations=lean)
        with SavedTensorMeter(net) as meter:
            net(x).sum().backward()
        saved[name] = meter.result.total_bytes
    compact = relu_output // 32 + (relu_output // 4 - round(0.9 * relu_output / 4)) * 4
    # without the lean ReLU the dense tensor is still saved (by the ReLU): DropIT adds its copy
    assert saved['dropit'] == saved['baseline'] + compact
    # with it, only the compact copy and the 1-bit mask remain
    assert saved['dropit+lean'] == saved['baseline'] - relu_output + compact + relu_output // 32
