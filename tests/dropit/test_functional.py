"""DropIT linear / conv gradients against independent references."""
from __future__ import annotations

import contextlib

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from mmdropit.dropit import from_dropit, to_dropit
from mmdropit.kernels.switch import eager_only


def topk_masked(x: torch.Tensor, gamma: float) -> torch.Tensor:
    """``x`` with all but its ``1 - gamma`` largest-magnitude elements set to zero."""
    flat = x.detach().reshape(-1)
    keep = flat.numel() - int(round(gamma * flat.numel()))
    index = flat.abs().topk(keep).indices
    masked = torch.zeros_like(flat)
    masked[index] = flat[index]
    return masked.view_as(x)


def reference_grads(layer: nn.Module, x: torch.Tensor, grad_out: torch.Tensor, gamma: float):
    """Plain layer: exact grad_input and grad_bias; grad_weight from the top-k-masked input."""
    x_exact = x.detach().clone().requires_grad_()
    out = layer(x_exact)
    grad_input, grad_bias = torch.autograd.grad(out, (x_exact, layer.bias), grad_out)
    if getattr(layer, 'padding_mode', 'zeros') != 'zeros':
        # the convolution's input is the padded tensor: that is what DropIT keeps a part of
        padded = F.pad(x, layer._reversed_padding_repeated_twice, mode=layer.padding_mode)
        masked_out = F.conv2d(topk_masked(padded, gamma), layer.weight, layer.bias,
                              layer.stride, 0, layer.dilation, layer.groups)
    else:
        masked_out = layer(topk_masked(x, gamma))
    (grad_weight,) = torch.autograd.grad(masked_out, layer.weight, grad_out)
    return out.detach(), grad_input, grad_weight, grad_bias


def dropit_grads(layer: nn.Module, x: torch.Tensor, grad_out: torch.Tensor, gamma: float,
                 strategy: str = 'mink'):
    to_dropit(layer, gamma=gamma, strategy=strategy, exclude=[])
    try:
        x_in = x.detach().clone().requires_grad_()
        out = layer(x_in)
        grad_input, grad_weight, grad_bias = torch.autograd.grad(
            out, (x_in, layer.weight, layer.bias), grad_out)
    finally:
        from_dropit(layer)
    return out.detach(), grad_input, grad_weight, grad_bias


def assert_grads_match(layer: nn.Module, x: torch.Tensor, gamma: float) -> None:
    torch.manual_seed(1)
    grad_out = torch.randn_like(layer(x))
    expected = reference_grads(layer, x, grad_out, gamma)
    got = dropit_grads(layer, x, grad_out, gamma)
    for name, e, g in zip(('output', 'grad_input', 'grad_weight', 'grad_bias'), expected, got):
        torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-5, msg=name)


@pytest.mark.parametrize('gamma', [0.0, 0.5, 0.9])
def test_linear_gradients(gamma):
    torch.manual_seed(0)
    assert_grads_match(nn.Linear(24, 12), torch.randn(3, 5, 24), gamma)


def test_gamma_zero_equals_the_plain_layer_exactly():
    torch.manual_seed(0)
    layer, x = nn.Linear(8, 4), torch.randn(6, 8)
    grad_out = torch.randn(6, 4)
    exact = torch.autograd.grad(layer(x), layer.weight, grad_out)[0]
    _, _, got, _ = dropit_grads(layer, x, grad_out, 0.0)
    assert torch.equal(got, exact)


def test_dropit_weight_gradient_differs_from_the_exact_one():
    torch.manual_seed(0)
    layer, x = nn.Linear(16, 4), torch.randn(10, 16)
    grad_out = torch.randn(10, 4)
    exact = torch.autograd.grad(layer(x), layer.weight, grad_out)[0]
    _, _, got, _ = dropit_grads(layer, x, grad_out, 0.9)
    assert not torch.allclose(got, exact, atol=1e-3)


CONV_CASES = [
    (nn.Conv2d, dict(in_channels=4, out_channels=6, kernel_size=3), (2, 4, 9, 9)),
    (nn.Conv2d, dict(in_channels=4, out_channels=6, kernel_size=3, stride=2, padding=1),
     (2, 4, 9, 9)),
    (nn.Conv2d, dict(in_channels=4, out_channels=6, kernel_size=3, padding='same', dilation=2),
     (2, 4, 9, 9)),
    (nn.Conv2d, dict(in_channels=4, out_channels=6, kernel_size=(2, 4), padding='same'),
     (2, 4, 9, 8)),  # uneven 'same' padding
    (nn.Conv2d, dict(in_channels=4, out_channels=6, kernel_size=3, padding='valid'),
     (2, 4, 7, 7)),
    (nn.Conv2d, dict(in_channels=4, out_channels=8, kernel_size=3, groups=2, padding=1),
     (2, 4, 7, 7)),
    (nn.Conv2d, dict(in_channels=4, out_channels=4, kernel_size=3, groups=4, padding=1),
     (2, 4, 7, 7)),  # depthwise
    (nn.Conv2d, dict(in_channels=3, out_channels=5, kernel_size=3, padding=2,
                     padding_mode='reflect'), (2, 3, 8, 8)),
    (nn.Conv1d, dict(in_channels=3, out_channels=5, kernel_size=5, stride=2, padding=2),
     (4, 3, 20)),
    (nn.Conv3d, dict(in_channels=2, out_channels=3, kernel_size=3, padding=1, dilation=1),
     (2, 2, 5, 6, 7)),
]


@pytest.mark.parametrize('gamma', [0.5, 0.9])
@pytest.mark.parametrize('conv_type,kwargs,shape', CONV_CASES)
def test_conv_gradients(conv_type, kwargs, shape, gamma):
    torch.manual_seed(0)
    assert_grads_match(conv_type(**kwargs), torch.randn(shape), gamma)


def test_channels_last_and_non_contiguous_inputs():
    torch.manual_seed(0)
    conv = nn.Conv2d(4, 6, 3, padding=1)
    x = torch.randn(2, 4, 8, 8).to(memory_format=torch.channels_last)
    assert_grads_match(conv, x, 0.8)
    linear = nn.Linear(6, 3)
    assert_grads_match(linear, torch.randn(6, 5).t(), 0.8)  # transposed view
    assert_grads_match(linear, torch.randn(5, 12)[:, ::2], 0.8)  # strided slice


def test_bf16_autocast_on_cpu_saves_bf16_and_matches_a_bf16_reference():
    torch.manual_seed(0)
    layer = nn.Linear(32, 16)
    # distinct magnitudes that bf16 represents exactly, so the top-k is unambiguous
    signs = torch.randint(0, 2, (256,)) * 2 - 1
    x = ((torch.randperm(256) + 1) * signs / 16.0).view(8, 32)
    grad_out = torch.randn(8, 16)
    with torch.autocast('cpu', dtype=torch.bfloat16):
        expected = layer(x)
    to_dropit(layer, gamma=0.75, exclude=[])
    saved_dtypes = []
    with torch.autograd.graph.saved_tensors_hooks(
            lambda t: saved_dtypes.append(t.dtype) or t, lambda t: t):
        with torch.autocast('cpu', dtype=torch.bfloat16):
            out = layer(x)
    assert out.dtype == torch.bfloat16 and torch.equal(out, expected)
    out.backward(grad_out.bfloat16())
    assert layer.weight.grad.dtype == torch.float32
    assert torch.bfloat16 in saved_dtypes and torch.float32 not in saved_dtypes
    masked = topk_masked(x.bfloat16(), 0.75).float()
    reference = grad_out.bfloat16().float().t() @ masked
    torch.testing.assert_close(layer.weight.grad, reference, rtol=2e-2, atol=2e-2)


def test_eval_and_no_grad_run_the_plain_op():
    torch.manual_seed(0)
    layer = nn.Conv2d(3, 4, 3)
    x = torch.randn(2, 3, 6, 6)
    expected = layer(x)
    to_dropit(layer, gamma=0.9, exclude=[])
    with torch.no_grad():
        assert torch.equal(layer(x), expected)
    layer.eval()
    out = layer(x)
    assert torch.equal(out, expected)
    assert out.grad_fn.name() == 'ConvolutionBackward0'
    layer.train()
    assert 'DropITConv' in layer(x).grad_fn.name()  # the C++ node or the Python Function


class _CountMatmuls(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.count = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten.mm.default, torch.ops.aten.bmm.default):
            self.count += 1
        return func(*args, **(kwargs or {}))


def test_grad_input_is_computed_only_when_needed():
    layer = to_dropit(nn.Linear(8, 4), gamma=0.5, exclude=[])
    counts = {}
    for needs_input_grad in (False, True):
        x = torch.randn(5, 8, requires_grad=needs_input_grad)
        loss = layer(x).sum()
        with _CountMatmuls() as counter:
            loss.backward()
        counts[needs_input_grad] = counter.count
    assert counts == {False: 1, True: 2}


class _RecordOperators(TorchDispatchMode):
    def __init__(self):
        super().__init__()
        self.names = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


def test_an_eager_forward_runs_the_selection_and_the_layer_alone():
    """Nothing else, e.g. no in-place adds on a counter tensor: on a GPU each operation is a
    launch that a host-bound step pays for (compiled steps count in a tensor, tested with
    ``torch.compile``)."""
    layer = to_dropit(nn.Linear(8, 4), gamma=0.5, exclude=[])
    x = torch.randn(5, 8, requires_grad=True)
    with _RecordOperators() as recorded:
        layer(x)
    launching = [name for name in recorded.names if name not in ('view', 't', 'select')]
    assert launching == ['keep', 'addmm']
    assert layer.dropit.keep_ratio == 0.5


class _Doubling(nn.Linear):
    def forward(self, x):
        return F.linear(2 * x, self.weight, self.bias)


def test_a_linear_subclass_keeps_its_own_forward():
    """Plain nn.Linear layers take a direct path to DropIT's function; a subclass with a
    forward of its own still runs that forward (its F.linear call routed to DropIT)."""
    torch.manual_seed(0)
    plain, doubling = nn.Linear(8, 4), _Doubling(8, 4)
    doubling.load_state_dict(plain.state_dict())
    x = torch.randn(5, 8)
    expected_plain, expected_doubling = plain(x), doubling(x)
    to_dropit(plain, gamma=0.5, exclude=[])
    to_dropit(doubling, gamma=0.5, exclude=[])
    torch.testing.assert_close(plain(x), expected_plain)
    got = doubling(x)
    torch.testing.assert_close(got, expected_doubling)
    assert got.grad_fn.name() in {'DropITLinearFunctionBackward',  # or its C++ node:
                                  'torch::autograd::CppNode<mmdropit::DropITLinearNode>'}


@pytest.mark.parametrize('path', ['fused', 'eager'])
def test_random_strategy_is_unbiased(path):
    """On the fused kernel's path (random keys from a drawn seed) and the eager one (a
    permutation), the mean of 2000 weight gradients is 10x nearer the exact one than one is."""
    torch.manual_seed(0)
    layer, x = nn.Linear(6, 3), torch.randn(20, 6)
    grad_out = torch.randn(20, 3)
    exact = torch.autograd.grad(layer(x), layer.weight, grad_out)[0]
    with eager_only() if path == 'eager' else contextlib.nullcontext():
        estimates = [dropit_grads(layer, x, grad_out, 0.5, 'random')[2] for _ in range(2000)]
    mean = torch.stack(estimates).mean(0)
    single_error = (estimates[0] - exact).abs().mean()
    assert (mean - exact).abs().mean() < single_error / 10


@pytest.mark.parametrize('bias', [True, False])
def test_linear_output_of_a_3d_input_can_be_changed_in_place(bias):
    """DETR's heads add to a Linear's output in place; a view returned by a custom Function
    may not be changed in place, so the output must be a tensor of its own."""
    torch.manual_seed(0)
    layer = nn.Linear(8, 16, bias=bias)
    reference = nn.Linear(8, 16, bias=bias)
    reference.load_state_dict(layer.state_dict())
    to_dropit(layer, gamma=0.5, exclude=[])
    x = torch.randn(2, 5, 8)
    out = layer(x)
    assert out._base is None
    out += 1.0
    out.pow(2).sum().backward()
    expected = reference(x) + 1.0
    expected.pow(2).sum().backward()
    torch.testing.assert_close(out, expected)
    if bias:
        torch.testing.assert_close(layer.bias.grad, reference.bias.grad)
