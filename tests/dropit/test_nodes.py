"""DropIT's Linear and convolution and the lean ReLU / Hardtanh as one C++ autograd node each
(``mmdropit/kernels/cpu/dropit_linear.cpp``, ``dropit_conv.cpp``, ``lean_activation.cpp``):
the same output, gradients and saved tensors as their Python Functions, bit for bit, wherever
a layer takes them: on the CPU, and on a GPU with the Triton kernels as their operators
(``pytest -m cuda``; here, those kernels in Triton's interpreter)."""
from __future__ import annotations

import copy
import functools
import os
from collections.abc import Callable

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from mmdropit.common.random_source import reseed
from mmdropit.dropit import DropITConfig, DropITConvFunction, DropITLinearFunction
from mmdropit.dropit.strategies import SAMPLE_SIZE
from mmdropit.dropit.lean_activations import _LeanActivationFunction, lean_hardtanh, lean_relu
from mmdropit.kernels import cuda, fused_linear_node
from mmdropit.kernels.cuda.nodes import register_kernels
from mmdropit.kernels.switch import eager_only, without_nodes
from mmdropit.memory import ProfiledPeakMeter

pytestmark = pytest.mark.skipif(fused_linear_node(torch.empty(1)) is None,
                                reason='the fused CPU kernels are not built')

LINEAR_NODE = 'torch::autograd::CppNode<mmdropit::DropITLinearNode>'
CONV_NODE = 'torch::autograd::CppNode<mmdropit::DropITConvNode>'
LEAN_NODE = 'torch::autograd::CppNode<mmdropit::LeanActivationNode>'
DEVICES = ['cpu', pytest.param('cuda', marks=[
    pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(),
                                         reason='needs a CUDA device')])]
LAYERS: dict[str, tuple[Callable[..., nn.Module], tuple[int, ...]]] = {
    'linear': (functools.partial(nn.Linear, 24, 12), (6, 24)),
    'linear 3-d': (functools.partial(nn.Linear, 24, 12), (2, 5, 24)),
    'linear 1-d': (functools.partial(nn.Linear, 24, 12), (24,)),
    'conv1d': (functools.partial(nn.Conv1d, 4, 6, 3), (2, 4, 10)),
    'conv2d stride 2': (functools.partial(nn.Conv2d, 4, 6, 3, stride=2, padding=1), (2, 4, 9, 9)),
    'conv2d groups, dilation': (functools.partial(nn.Conv2d, 4, 6, 3, padding=2, dilation=2,
                                                  groups=2), (2, 4, 8, 8)),
    'conv3d': (functools.partial(nn.Conv3d, 2, 4, 3, padding=1), (1, 2, 5, 5, 5)),
}
"""Layers of every kind a node serves (built by ``factory(bias=..., device=...)``) and an input
shape for each."""


def _layer(kind: str = 'linear', bias: bool = True, gamma: float = 0.9, device: str = 'cpu',
           strategy: str = 'mink') -> tuple[nn.Module, torch.Tensor]:
    """A DropIT layer of ``kind`` (:data:`LAYERS`) and an input for it."""
    factory, shape = LAYERS[kind]
    torch.manual_seed(0)
    layer = factory(bias=bias, device=device)
    DropITConfig(gamma, strategy, exclude=[]).apply(layer)
    return layer, torch.randn(shape, device=device)


def _node(layer: nn.Module) -> str:
    return LINEAR_NODE if isinstance(layer, nn.Linear) else CONV_NODE


def _python(layer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The layer's Python Function applied to ``x``."""
    if isinstance(layer, nn.Linear):
        return DropITLinearFunction.apply(x, layer.weight, layer.bias, layer.dropit)
    return DropITConvFunction.apply(x, layer.weight, layer.bias, list(layer.stride),
                                    list(layer.padding), list(layer.dilation), layer.groups,
                                    None, layer.dropit)


def _run(layer: nn.Module, x: torch.Tensor, python: bool) -> dict[str, torch.Tensor | str]:
    """The layer's output, its grad_fn's name, the gradients of every input that needs one,
    and the tensors it saved, from the Python Function (``python``) or the layer as it runs."""
    x = x.detach().clone().requires_grad_(x.requires_grad)
    saved: list[torch.Tensor] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = _python(layer, x) if python else layer(x)
    inputs = [t for t in (x, layer.weight, layer.bias) if t is not None and t.requires_grad]
    grads = torch.autograd.grad(out, inputs,
                                torch.randn_like(out, generator=_generator(out.device)))
    return {'out': out.detach(), 'grad_fn': out.grad_fn.name(), 'grads': grads,
            'saved': saved}


def _generator(device: torch.device) -> torch.Generator:
    return torch.Generator(device).manual_seed(1)


def _assert_same(node: dict, python: dict, name: str) -> None:
    assert node['grad_fn'] == name and python['grad_fn'] != name
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
@pytest.mark.parametrize('kind', list(LAYERS))
@pytest.mark.parametrize('bias', [True, False])
@pytest.mark.parametrize('input_grad', [True, False])
def test_the_node_computes_what_the_python_function_does(kind, bias, input_grad, device):
    layer, x = _layer(kind, bias, device=device)
    x.requires_grad_(input_grad)
    _assert_same(_run(layer, x, python=False), _run(layer, x, python=True), _node(layer))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')
@pytest.mark.parametrize('strategy', ['mink', 'random'])
@pytest.mark.parametrize('kind', ['linear', 'conv2d stride 2'])
def test_on_a_gpu_the_node_never_waits_for_it(kind, strategy):
    layer, x = _layer(kind, device='cuda', strategy=strategy)
    x.requires_grad_()
    layer(x).sum().backward()  # first use: plans, workspaces and the registration are made
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode('error')
    try:
        out = layer(x)
        out.sum().backward()
    finally:
        torch.cuda.set_sync_debug_mode('default')
    assert out.grad_fn.name() == _node(layer)


@pytest.mark.parametrize('kind', ['linear 3-d', 'conv2d stride 2'])
def test_the_triton_selection_kernels_serve_the_node(monkeypatch, kind):
    """What :func:`~mmdropit.kernels.cuda.node_ready` registers for CUDA, registered for the
    CPU here, where Triton's interpreter runs the kernels: the node calls them, and computes
    what it does with the C++ kernels."""
    layer, x = _layer(kind)
    x.requires_grad_()
    expected = _run(layer, x, python=False)
    calls, got = _with_triton_kernels(monkeypatch, cuda.load,
                                      ('keep_topk', 'scatter_bitmask'),
                                      lambda: _run(layer, x, python=False))
    assert calls == ['keep_topk', 'scatter_bitmask'] and got['grad_fn'] == _node(layer)
    _assert_equal(got, expected)


@pytest.mark.parametrize('kind', ['linear 3-d', 'conv2d stride 2'])
def test_the_triton_random_selection_serves_the_node(monkeypatch, kind):
    """``random`` on the Triton kernels (registered for the CPU, as above): the node draws
    from DropIT's generator what the Python Function draws, through the same kernel (its seed
    drawn on the device, not the C++ kernel's), and computes the same, bit for bit."""
    layer, x = _layer(kind, strategy='random')
    x.requires_grad_()

    def node_and_function() -> tuple[dict, dict]:
        reseed(0)
        node = _run(layer, x, python=False)
        reseed(0)
        return node, _run(layer, x, python=True)

    calls, (node, python) = _with_triton_kernels(monkeypatch, cuda.load,
                                                 ('keep_random', 'scatter_bitmask'),
                                                 node_and_function)
    assert calls == ['keep_random', 'scatter_bitmask'] * 2
    _assert_same(node, python, _node(layer))


def _with_triton_kernels(monkeypatch, module: Callable, names: tuple[str, ...],
                         run: Callable[[], dict]) -> tuple[list[str], dict]:
    """``run()`` with the Triton kernels registered for the CPU, as they are for CUDA (Triton's
    interpreter runs them on CPU tensors), and the names of the kernels of ``module()`` it
    called, in order."""
    if module() is None or os.environ.get('TRITON_INTERPRET') != '1':
        pytest.skip('Triton cannot run here (no GPU, no interpreter)')
    calls: list[str] = []

    def noted(name: str, kernel: Callable, *args):
        calls.append(name)
        return kernel(*args)

    for name in names:
        monkeypatch.setattr(module(), name, functools.partial(noted, name,
                                                              getattr(module(), name)))
    registration = register_kernels('CPU')
    try:
        return calls, run()
    finally:
        registration._destroy()


def _backward_peak(layer: nn.Module, x: torch.Tensor, python: bool = False) -> int:
    """The bytes a step of ``layer`` on ``x`` allocates at its highest, from the allocator's
    reports (no dispatch mode: the node runs), its second step's (the first may cache)."""
    grad = torch.randn_like(layer(x.detach()))
    for _ in range(2):
        layer.zero_grad(set_to_none=True)
        with ProfiledPeakMeter() as meter:
            out = _python(layer, x) if python else layer(x)
            out.backward(grad)
    return meter.result.peak_bytes


@pytest.mark.parametrize('python', [False, True], ids=['node', 'python function'])
@pytest.mark.parametrize('kind', ['linear', 'conv'])
def test_a_backward_never_holds_the_rebuilt_input_beside_the_input_gradient(kind, python):
    """The weight gradient comes first, from the input rebuilt dense, which is freed before the
    input gradient takes memory: at the start of a checkpointed block's backward (the step's
    peak under per-block checkpointing) the two would otherwise be held together. So a step
    takes no more than the plain layer's and the kept part (both at once: an input more)."""
    torch.manual_seed(0)
    if kind == 'linear':
        plain, x = nn.Linear(256, 64), torch.randn(1024, 256, requires_grad=True)
    else:
        plain, x = nn.Conv2d(16, 16, 3, padding=1), torch.randn(16, 16, 32, 32,
                                                               requires_grad=True)
    layer = copy.deepcopy(plain)
    DropITConfig(0.9, 'mink', exclude=[]).apply(layer)
    assert layer(x).grad_fn.name() == _node(layer)  # the layer runs the node
    size = x.numel() * x.element_size()
    assert _backward_peak(layer, x, python) < _backward_peak(plain, x) + 0.5 * size


@pytest.mark.parametrize('kind', ['linear', 'conv2d stride 2'])
def test_a_frozen_bias_gets_no_gradient_from_the_node(kind):
    layer, x = _layer(kind)
    layer.bias.requires_grad_(False)
    node = _run(layer, x, python=False)
    assert node['grad_fn'] == _node(layer) and len(node['grads']) == 1  # the weight's alone


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('kind', ['linear', 'conv2d stride 2'])
def test_under_bf16_autocast_the_node_saves_and_computes_in_bf16(kind, device):
    """As the Python Function on the bf16 casts of the input and parameters."""
    layer, x = _layer(kind, device=device)
    x.requires_grad_()
    with torch.autocast(device, torch.bfloat16):
        node = _run(layer, x, python=False)
    python = _run(copy.deepcopy(layer).to(torch.bfloat16), x.to(torch.bfloat16), python=True)
    assert node['out'].dtype == torch.bfloat16
    assert [t.dtype for t in node['saved'][1:]] == [torch.uint8, torch.bfloat16]
    assert torch.equal(node['out'], python['out'])
    for got, expected in zip(node['grads'], python['grads']):
        assert got.dtype == torch.float32 and torch.equal(got.to(torch.bfloat16), expected)


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('kind', ['linear', 'conv2d stride 2'])
def test_under_a_checkpoint_the_node_gives_the_python_functions_gradients(kind, device):
    """Non-reentrant checkpointing drops what the first pass saves (the Python Function's
    placeholders there) and runs the layer again in backward (the node), comparing the two
    passes' saved tensors by shape and dtype."""
    layer, x = _layer(kind, device=device)

    def grads(python: bool) -> tuple[torch.Tensor, ...]:
        def block(inputs: torch.Tensor) -> torch.Tensor:
            out = _python(layer, inputs) if python else layer(inputs)
            return torch.nn.functional.gelu(out)
        inputs = x.clone().requires_grad_()
        out = checkpoint(block, inputs, use_reentrant=False)
        return torch.autograd.grad(out.square().sum(), (inputs, layer.weight, layer.bias))

    for got, expected in zip(grads(False), grads(True)):
        assert torch.equal(got, expected)


BIGGER = {'linear 3-d': (40, 100, 24), 'conv2d stride 2': (8, 4, 48, 48)}
"""Inputs of more elements than ``mink_approx`` samples (:data:`SAMPLE_SIZE`)."""


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('kind', list(BIGGER))
@pytest.mark.parametrize('selection', ['random', 'mink_approx', 'indices'])
def test_the_node_saves_each_strategys_selection_as_the_function_does(selection, kind, device):
    """``mink_approx`` (on an input above its sample) and the indices encoding (``mink`` at
    gamma 0.99) are selected by the layer, as its Python Function selects them, and given to
    the node; ``random`` the node draws itself, from the generator the Function draws from:
    the same outputs, gradients and saved tensors, bit for bit (the same draws: DropIT's
    generator reseeded before each)."""
    factory, _ = LAYERS[kind]
    torch.manual_seed(0)
    layer = factory(device=device)
    strategy = 'mink' if selection == 'indices' else selection
    DropITConfig(0.99 if selection == 'indices' else 0.9, strategy, exclude=[]).apply(layer)
    x = torch.randn(BIGGER[kind], device=device, requires_grad=True)
    assert x.numel() > SAMPLE_SIZE
    reseed(0)
    node = _run(layer, x, python=False)
    reseed(0)
    python = _run(layer, x, python=True)
    _assert_same(node, python, _node(layer))
    first = node['saved'][1]
    assert first.dtype == (torch.int32 if selection == 'indices' else torch.uint8)


@pytest.mark.parametrize('why', ['eager', 'without node', 'value_bits', 'no grad'])
@pytest.mark.parametrize('kind', ['linear', 'conv2d stride 2'])
def test_the_python_function_runs_where_the_node_cannot(why, kind):
    """The eager path and 8-bit kept values have no node, nor has a layer inside
    ``without_nodes``; without grad the layer runs plainly."""
    layer, x = _layer(kind)
    if why == 'value_bits':
        layer.dropit.value_bits = 8
    x.requires_grad_()
    if why == 'eager':
        with eager_only():
            out = layer(x)
    elif why == 'without node':
        with without_nodes():
            out = layer(x)
    elif why == 'no grad':
        with torch.no_grad():
            out = layer(x)
    else:
        out = layer(x)
    assert out.grad_fn is None if why == 'no grad' else out.grad_fn.name() != _node(layer)


def test_a_convolution_padded_unevenly_keeps_the_python_function():
    """``padding='same'`` with an even kernel pads one side more, before the convolution: the
    node has no such padding."""
    torch.manual_seed(0)
    layer = nn.Conv2d(4, 6, 2, padding='same')
    DropITConfig(0.9, 'mink', exclude=[]).apply(layer)
    out = layer(torch.randn(2, 4, 8, 8, requires_grad=True))
    assert out.shape == (2, 6, 8, 8) and out.grad_fn.name() != _node(layer)


def _graph_nodes(out: torch.Tensor) -> set[str]:
    """The names of every node of ``out``'s autograd graph."""
    seen, names, stack = set(), set(), [out.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        names.add(node.name())
        stack.extend(next_node for next_node, _ in node.next_functions)
    return names


@pytest.mark.parametrize('name', ['resnet18', 'vit_tiny_patch16_224'])
def test_a_timm_model_trains_with_the_nodes_as_with_the_python_functions(name):
    # ResNet-18's ReLUs are lean activations: their node is in its graph too
    """A whole real model: one step's loss and every gradient bit for bit, with the nodes in
    its graph (a layer routed past them, a saved tensor or count gone astray, would show)."""
    import timm
    torch.manual_seed(0)
    kwargs = {'img_size': 32, 'patch_size': 8, 'depth': 2} if name.startswith('vit') else {}
    model = timm.create_model(name, num_classes=10, **kwargs)
    DropITConfig(0.9, 'mink', exclude=[]).apply(model)
    images, labels = torch.randn(2, 3, 32, 32), torch.tensor([1, 7])

    def step() -> tuple[set[str], list[torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        loss = nn.functional.cross_entropy(model(images), labels)
        names = _graph_nodes(loss)
        loss.backward()
        return names, [loss.detach(), *(p.grad for p in model.parameters())]

    names, with_nodes = step()
    with without_nodes():
        python_names, python = step()
    expected = {LINEAR_NODE} if name.startswith('vit') else {LINEAR_NODE, CONV_NODE, LEAN_NODE}
    assert expected <= names and not (expected & python_names)
    for got, want in zip(with_nodes, python):
        assert torch.equal(got, want)


LEAN = {'relu': (lean_relu, (), ('relu', 0.0, 0.0, 0.0)),
        'hardtanh': (lean_hardtanh, (-0.5, 0.5), ('hardtanh', -0.5, 0.5, 0.0))}
"""The lean activations a node serves: the function, its arguments after the input, and the
Python Function's arguments for the same."""


def _lean_run(kind: str, x: torch.Tensor, inplace: bool, python: bool) -> dict:
    """A lean activation's output, grad_fn, input gradient and saved bits, from the Python
    Function (``python``) or as it runs; the input is the output of an operation (a leaf may
    not be changed in place)."""
    function, args, python_args = LEAN[kind]
    leaf = x.detach().clone().requires_grad_()
    before = leaf * 1.0
    saved: list[torch.Tensor] = []

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved.append(tensor)
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        out = (_LeanActivationFunction.apply(before, *python_args, inplace) if python
               else function(before, *args, inplace=inplace))
    assert (out is before) == inplace
    name = out.grad_fn.name()
    out.backward(torch.randn_like(out, generator=_generator(out.device)))
    return {'out': out.detach(), 'grad_fn': name, 'grads': (leaf.grad,), 'saved': saved}


@pytest.mark.parametrize('device', DEVICES)
@pytest.mark.parametrize('kind', list(LEAN))
@pytest.mark.parametrize('inplace', [False, True])
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_the_lean_activation_node_computes_what_its_python_function_does(kind, inplace, dtype,
                                                                          device):
    torch.manual_seed(0)
    x = torch.randn(3, 5, 7, device=device, dtype=dtype)
    x[0, 0, :3] = torch.tensor([0.0, -0.5, 0.5])  # on the bounds: the gradient does not pass
    _assert_same(_lean_run(kind, x, inplace, python=False),
                 _lean_run(kind, x, inplace, python=True), LEAN_NODE)


def test_a_lean_activation_takes_its_python_function_where_the_node_cannot():
    """A non-contiguous input, the switch, and LeakyReLU (its gradient is not a mask)."""
    x = torch.randn(6, 4, requires_grad=True)
    assert lean_relu(x.t()).grad_fn.name() != LEAN_NODE
    with without_nodes():
        assert lean_relu(x).grad_fn.name() != LEAN_NODE
    assert lean_relu(x).grad_fn.name() == LEAN_NODE
    layer = nn.LeakyReLU()
    DropITConfig(0.9, 'mink', exclude=[]).apply(nn.Sequential(nn.Linear(4, 4), layer))
    assert layer(x).grad_fn.name() != LEAN_NODE


def test_the_triton_mask_kernels_serve_the_lean_node(monkeypatch):
    """As for the selection kernels: ``pack_between`` and ``where_bits`` of the codec kernels
    registered for the CPU, in Triton's interpreter."""
    x = torch.randn(4, 9)
    expected = _lean_run('hardtanh', x, False, python=False)
    calls, got = _with_triton_kernels(monkeypatch, cuda.load_codecs,
                                      ('pack_between', 'where_bits'),
                                      lambda: _lean_run('hardtanh', x, False, python=False))
    assert calls == ['pack_between', 'where_bits'] and got['grad_fn'] == LEAN_NODE
    _assert_equal(got, expected)
