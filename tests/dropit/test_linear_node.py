"""DropIT's Linear as one C++ autograd node (``mmdropit/kernels/cpu/dropit_linear.cpp``): the
same output, gradients and saved tensors as the Python ``DropITLinearFunction``, bit for bit,
wherever a layer takes it: on the CPU, and on a GPU with the Triton kernels as its selection
operators (``pytest -m cuda``; here, those kernels in Triton's interpreter)."""
from __future__ import annotations

import functools
import os

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from mmdropit.dropit import DropITConfig, DropITLinearFunction
from mmdropit.dropit.state import DropITState
from mmdropit.kernels import cuda, fused_linear_node
from mmdropit.kernels.cuda.linear_node import register_selection
from mmdropit.kernels.switch import eager_only, without_linear_node

pytestmark = pytest.mark.skipif(fused_linear_node(torch.empty(1)) is None,
                                reason='the fused CPU kernels are not built')

NODE = 'torch::autograd::CppNode<mmdropit::DropITLinearNode>'
DEVICES = ['cpu', pytest.param('cuda', marks=[
    pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(),
                                         reason='needs a CUDA device')])]


def _layer(bias: bool = True, gamma: float = 0.9, device: str = 'cpu') -> nn.Linear:
    torch.manual_seed(0)
    layer = nn.Linear(24, 12, bias=bias, device=device)
    DropITConfig(gamma, 'mink', exclude=[]).apply(layer)
    return layer


def _run(layer: nn.Linear, x: torch.Tensor, python: bool) -> dict[str, torch.Tensor | str]:
    """The layer's output, its grad_fn's name, the gradients of every input that needs one,
    and the tensors it saved, from the Python Function (``python``) or the layer as it runs."""
    x = x.detach().clone().requires_grad_(x.requires_grad)
    saved: list[torch.Tensor] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = (DropITLinearFunction.apply(x, layer.weight, layer.bias, layer.dropit) if python
               else layer(x))
    inputs = [t for t in (x, layer.weight, layer.bias) if t is not None and t.requires_grad]
    grads = torch.autograd.grad(out, inputs,
                                torch.randn_like(out, generator=_generator(out.device)))
    return {'out': out.detach(), 'grad_fn': out.grad_fn.name(), 'grads': grads,
            'saved': saved}


def _generator(device: torch.device) -> torch.Generator:
    return torch.Generator(device).manual_seed(1)


def _assert_same(node: dict, python: dict) -> None:
    assert node['grad_fn'] == NODE and python['grad_fn'] != NODE
    _assert_equal(node, python)


def _assert_equal(node: dict, python: dict) -> None:
    """The same output, gradients and saved tensors, bit for bit."""
    assert torch.equal(node['out'], python['out'])
    assert len(node['grads']) == len(python['grads'])
    for got, expected in zip(node['grads'], python['grads']):
        assert got.dtype == expected.dtype and torch.equal(got, expected)
    assert [(t.shape, t.dtype) for t in node['saved']] == \
        [(t.shape, t.dtype) for t in python['saved']]
    for got, expected in zip(node['saved'], python['saved']):
        assert torch.equal(got, expected)


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('shape', [(6, 24), (2, 5, 24), (24,)])
@pytest.mark.parametrize('bias', [True, False])
@pytest.mark.parametrize('input_grad', [True, False])
def test_the_node_computes_what_the_python_function_does(shape, bias, input_grad, device):
    layer = _layer(bias, device=device)
    x = torch.randn(shape, device=device).requires_grad_(input_grad)
    _assert_same(_run(layer, x, python=False), _run(layer, x, python=True))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')
def test_on_a_gpu_the_node_never_waits_for_it():
    layer = _layer(device='cuda')
    x = torch.randn(64, 24, device='cuda', requires_grad=True)
    layer(x).sum().backward()  # first use: plans, workspaces and the registration are made
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode('error')
    try:
        out = layer(x)
        out.sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode('default')
    assert out.grad_fn.name() == NODE


def test_the_triton_selection_kernels_serve_the_node(monkeypatch):
    """What :func:`~mmdropit.kernels.cuda.node_ready` registers for CUDA, registered for the
    CPU here, where Triton's interpreter runs the kernels: the node calls them, and computes
    what it does with the C++ kernels."""
    if cuda.load() is None or os.environ.get('TRITON_INTERPRET') != '1':
        pytest.skip('Triton cannot run here (no GPU, no interpreter)')
    layer, x = _layer(), torch.randn(2, 5, 24, requires_grad=True)
    expected = _run(layer, x, python=False)
    calls: list[str] = []
    kernels = cuda.load()
    for name in ('keep_topk', 'scatter_bitmask'):
        kernel = getattr(kernels, name)
        monkeypatch.setattr(kernels, name, functools.partial(_noted, calls, name, kernel))
    registration = register_selection('CPU')
    try:
        got = _run(layer, x, python=False)
    finally:
        registration._destroy()
    assert calls == ['keep_topk', 'scatter_bitmask'] and got['grad_fn'] == NODE
    _assert_equal(got, expected)


def _noted(calls: list[str], name: str, kernel, *args):
    calls.append(name)
    return kernel(*args)


def test_a_frozen_bias_gets_no_gradient_from_the_node():
    layer = _layer()
    layer.bias.requires_grad_(False)
    node = _run(layer, torch.randn(6, 24), python=False)
    assert node['grad_fn'] == NODE and len(node['grads']) == 1  # the weight's alone


@pytest.mark.parametrize('device', DEVICES)
def test_under_bf16_autocast_the_node_saves_and_computes_in_bf16(device):
    """As the Python Function on the bf16 casts of the input and parameters."""
    layer, x = _layer(device=device), torch.randn(6, 24, device=device, requires_grad=True)
    with torch.autocast(device, torch.bfloat16):
        node = _run(layer, x, python=False)
    python = _run(_bf16_twin(layer), x.to(torch.bfloat16), python=True)
    assert node['out'].dtype == torch.bfloat16
    assert [t.dtype for t in node['saved'][1:]] == [torch.uint8, torch.bfloat16]
    assert torch.equal(node['out'], python['out'])
    for got, expected in zip(node['grads'], python['grads']):
        assert got.dtype == torch.float32 and torch.equal(got.to(torch.bfloat16), expected)


def _bf16_twin(layer: nn.Linear) -> nn.Linear:
    """``layer`` with bf16 parameters, for the Python Function outside autocast."""
    twin = nn.Linear(24, 12, device=layer.weight.device, dtype=torch.bfloat16)
    twin.load_state_dict({k: v.to(torch.bfloat16) for k, v in layer.state_dict().items()})
    twin.dropit = DropITState('twin', gamma=0.9, base_gamma=0.9, strategy='mink')
    return twin


def test_under_a_checkpoint_the_node_gives_the_python_functions_gradients():
    """Non-reentrant checkpointing drops what the node saved and runs it again in backward."""
    layer, x = _layer(), torch.randn(4, 24)

    def grads(python: bool) -> tuple[torch.Tensor, ...]:
        def block(inputs: torch.Tensor) -> torch.Tensor:
            out = (DropITLinearFunction.apply(inputs, layer.weight, layer.bias, layer.dropit)
                   if python else layer(inputs))
            return torch.nn.functional.gelu(out)
        inputs = x.clone().requires_grad_()
        out = checkpoint(block, inputs, use_reentrant=False)
        return torch.autograd.grad(out.square().sum(), (inputs, layer.weight, layer.bias))

    for got, expected in zip(grads(False), grads(True)):
        assert torch.equal(got, expected)


@pytest.mark.parametrize('why', ['eager', 'without node', 'value_bits', 'gamma 0.99',
                                 'no grad'])
def test_the_python_function_runs_where_the_node_cannot(why):
    """The eager path, 8-bit kept values and the indices encoding (gamma 0.99) have no node,
    nor has a layer inside ``without_linear_node``; without grad the layer runs plainly."""
    layer = _layer(gamma=0.99 if why == 'gamma 0.99' else 0.9)
    if why == 'value_bits':
        layer.dropit.value_bits = 8
    x = torch.randn(6, 24, requires_grad=True)
    if why == 'eager':
        with eager_only():
            out = layer(x)
    elif why == 'without node':
        with without_linear_node():
            out = layer(x)
    elif why == 'no grad':
        with torch.no_grad():
            out = layer(x)
    else:
        out = layer(x)
    assert out.grad_fn is None if why == 'no grad' else out.grad_fn.name() != NODE
