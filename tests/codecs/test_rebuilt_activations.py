"""Rebuilt activations: the same gradients bit for bit, a lower peak where an activation feeds a
layer, and plain modules wherever another technique manages what is saved."""
from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from unittest import mock

import timm
import torch
from torch import nn

import pytest
from mmdropit import ConfigError
from mmdropit.checkpoint import checkpoint_module, uncheckpoint
from mmdropit.codecs import compress_activations
from mmdropit.codecs.rebuilt_activations import RebuiltActivationsConfig, _Rebuild
from mmdropit.memory import SavedTensorMeter, StepPeakMeter


def _mlp(dropout: float = 0.0) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Dropout(dropout),
                                         nn.Linear(256, 64)) for _ in range(4)])


@contextlib.contextmanager
def counted_rebuilds() -> Iterator[list[int]]:
    """How many times an activation's output was rebuilt in backward (one entry each)."""
    calls: list[int] = []
    tensor = _Rebuild.tensor

    def counted(self):
        calls.append(1)
        return tensor(self)

    _Rebuild.tensor = counted
    try:
        yield calls
    finally:
        _Rebuild.tensor = tensor


def _without_and_with(model: nn.Module, images: torch.Tensor
                      ) -> tuple[tuple[list[torch.Tensor], int], tuple[list[torch.Tensor], int]]:
    """:func:`_step` as ``model`` is, then with rebuilt activations (removed again after)."""
    before = _step(model, images)
    with RebuiltActivationsConfig().apply(model):
        return before, _step(model, images)


def _step(model: nn.Module, images: torch.Tensor) -> tuple[list[torch.Tensor], int]:
    """The gradients and the activation peak (the second of two metered steps)."""
    for _ in range(2):
        torch.manual_seed(1)  # the same dropout masks in every step
        with StepPeakMeter(model) as meter:
            model(images).square().mean().backward()
        grads = [param.grad.clone() for param in model.parameters()]
        model.zero_grad(set_to_none=True)
    return grads, meter.result.activation_peak_bytes


def test_the_gradients_are_the_same_and_the_peak_holds_one_tensor_per_activation_less():
    model, images = _mlp(), torch.randn(128, 64)
    (plain_grads, plain_peak), (grads, peak) = _without_and_with(model, images)
    assert all(torch.equal(a, b) for a, b in zip(grads, plain_grads))
    gelu_outputs = 4 * 128 * 256 * 4
    assert peak <= plain_peak - gelu_outputs + 128 * 256 * 4  # one rebuilt at a time
    assert _step(model, images)[1] == plain_peak  # removed: plain modules again


def test_the_saved_bytes_meter_sees_the_output_no_longer_kept():
    net = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 8))
    images = torch.randn(32, 64)
    with SavedTensorMeter(net) as plain:
        net(images).sum().backward()
    with RebuiltActivationsConfig().apply(net), SavedTensorMeter(net) as rebuilt:
        net(images).sum().backward()
    assert plain.result.total_bytes - rebuilt.result.total_bytes == 32 * 256 * 4


def test_a_note_nobody_reads_holds_nothing_once_the_output_is_gone():
    net = nn.Sequential(nn.Linear(8, 8), nn.GELU())
    RebuiltActivationsConfig().apply(net)
    hidden = net[0](torch.randn(4, 8))
    alive = weakref.ref(hidden)
    output = net[1](hidden)
    del hidden
    assert alive() is not None  # the GELU's own backward keeps it
    del output  # nothing read the note; the graph goes with the output
    assert alive() is None


def test_a_timm_vit_in_bf16_gets_the_same_gradients_with_less_memory():
    torch.manual_seed(0)
    vit = timm.create_model('vit_tiny_patch16_224', img_size=32, patch_size=8, depth=2,
                            num_classes=10).train()
    images = torch.randn(8, 3, 32, 32)

    def step() -> tuple[list[torch.Tensor], int]:
        with StepPeakMeter(vit) as meter:
            with torch.autocast('cpu', torch.bfloat16):
                loss = vit(images).float().square().mean()
            loss.backward()
        grads = [param.grad.clone() for param in vit.parameters()]
        vit.zero_grad(set_to_none=True)
        return grads, meter.result.activation_peak_bytes

    plain_grads, plain_peak = step()
    with RebuiltActivationsConfig().apply(vit) as applied:
        grads, peak = step()
    assert applied.summary == 'rebuilt activations: 2 activations, 10 layers converted'
    assert all(torch.equal(a, b) for a, b in zip(grads, plain_grads))
    assert peak < plain_peak


def test_a_silu_feeding_a_convolution_is_rebuilt_and_double_backward_still_holds():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.SiLU(), nn.Conv2d(8, 4, 3)).double()
    images = torch.randn(2, 3, 12, 12, dtype=torch.float64)

    def second_order() -> list[torch.Tensor]:
        grads = torch.autograd.grad(net(images).square().sum(), list(net.parameters()),
                                    create_graph=True)
        return list(torch.autograd.grad(sum(g.square().sum() for g in grads),
                                        list(net.parameters())))

    expected = second_order()
    with RebuiltActivationsConfig().apply(net), counted_rebuilds() as rebuilds:
        got = second_order()
    assert rebuilds and all(torch.allclose(a, b) for a, b in zip(got, expected))


@pytest.mark.parametrize('activation', [nn.SiLU, nn.Hardswish, nn.Mish])
def test_an_in_place_activation_is_left_plain(activation):
    """Its output is its input: nothing is left to rebuild from (mmdet's ConvModule uses
    ``SiLU(inplace=True)``)."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), activation(inplace=True),
                        nn.Conv2d(8, 4, 3), nn.GELU(), nn.Conv2d(4, 2, 3))
    images = torch.randn(2, 3, 16, 16)
    plain_grads, plain_peak = _step(net, images)
    with RebuiltActivationsConfig().apply(net), counted_rebuilds() as rebuilds:
        assert type(net[2]) is activation and type(net[4]) is not nn.GELU
        grads, peak = _step(net, images)
    assert all(torch.equal(a, b) for a, b in zip(grads, plain_grads))
    assert peak <= plain_peak and len(rebuilds) == 2  # the GELU's, in each of two steps
    with pytest.raises(ConfigError, match=r'\(in place ones are left out\)'):
        RebuiltActivationsConfig().apply(nn.Sequential(nn.Linear(2, 2), activation(True)))


def test_a_weight_changed_in_place_before_backward_is_still_an_error():
    """Saved-tensor hooks turn off autograd's own check of what they pack: the layer's
    unpack hook checks the tensors it saved as they are (the optimizer stepped too early)."""
    net = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8))
    RebuiltActivationsConfig().apply(net)
    out = net(torch.randn(4, 8))
    with torch.no_grad():
        net[2].weight.mul_(3)
    with pytest.raises(RuntimeError, match='modified by an inplace operation'):
        out.sum().backward()


def test_an_input_changed_after_the_activation_ran_is_an_error_even_for_the_layer_alone():
    net = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8))
    RebuiltActivationsConfig().apply(net)
    hidden = net[0](torch.randn(4, 8))
    output = net[1](hidden)
    with torch.no_grad():
        hidden.add_(1)  # before the layer is called: what it would rebuild from has changed
    out = net[2](output)
    with pytest.raises(RuntimeError, match='rebuilt activations: the input of an activation'):
        torch.autograd.grad(out.sum(), net[2].weight)


def test_under_torch_func_the_modules_run_plain():
    net = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4))
    params = dict(net.named_parameters())
    images = torch.randn(4, 8)

    def loss(values: dict) -> torch.Tensor:
        return torch.func.functional_call(net, values, (images,)).square().sum()

    expected = torch.func.grad(loss)(params)
    with RebuiltActivationsConfig().apply(net):
        got = torch.func.grad(loss)(params)
    assert all(torch.equal(got[name], expected[name]) for name in params)


def test_an_output_something_else_keeps_is_handed_back_not_computed_again():
    net = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 8))
    images = torch.randn(32, 64)

    def step() -> tuple[list[torch.Tensor], int]:
        with StepPeakMeter(net) as meter:
            hidden = net[1](net[0](images))
            kept = hidden * 2  # saves the GELU's output as well: it stays alive
            (net[2](hidden).sum() + kept.sum()).backward()
        grads = [param.grad.clone() for param in net.parameters()]
        net.zero_grad(set_to_none=True)
        return grads, meter.result.activation_peak_bytes

    expected, plain_peak = step()
    runs: list[int] = []
    forward = nn.GELU.forward
    with RebuiltActivationsConfig().apply(net), mock.patch.object(
            nn.GELU, 'forward', lambda self, x: runs.append(1) or forward(self, x)):
        got, peak = step()
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert peak <= plain_peak and len(runs) == 1  # the forward pass's run only


def test_where_the_output_does_not_reach_the_layer_unchanged_nothing_is_rebuilt():
    model, images = _mlp(dropout=0.5), torch.randn(128, 64)
    (plain_grads, plain_peak), (grads, peak) = _without_and_with(model, images)
    assert all(torch.equal(a, b) for a, b in zip(grads, plain_grads))
    assert peak == plain_peak


def test_inside_a_checkpoint_the_modules_run_plain():
    model, images = _mlp(), torch.randn(128, 64)
    for block in model:
        checkpoint_module(block)
    (plain_grads, plain_peak), (grads, peak) = _without_and_with(model, images)
    assert all(torch.equal(a, b) for a, b in zip(grads, plain_grads))
    assert peak == plain_peak
    for block in model:
        uncheckpoint(block)


def test_under_other_saved_tensor_hooks_the_modules_run_plain():
    """Where another technique stores what is saved (``save_on_cpu`` here copies it), a note
    would keep the activation's input where that technique let it go."""
    model, images = _mlp(), torch.randn(128, 64)
    model.forward = lambda x, forward=model.forward: _on_cpu(forward, x)
    (plain_grads, plain_peak), (grads, peak) = _without_and_with(model, images)
    assert all(torch.equal(a, b) for a, b in zip(grads, plain_grads))
    assert peak == plain_peak


def _on_cpu(forward, x: torch.Tensor) -> torch.Tensor:
    with torch.autograd.graph.save_on_cpu():
        return forward(x)


def test_a_compressed_activation_is_left_to_its_codes():
    model, images = _mlp(), torch.randn(128, 64)
    compress_activations(model, bits=8, types=[nn.GELU])
    (compressed_grads, compressed_peak), (grads, peak) = _without_and_with(model, images)
    assert all(torch.equal(a, b) for a, b in zip(grads, compressed_grads))
    assert peak == compressed_peak


def test_compiled_the_model_is_one_graph_with_the_eager_gradients():
    model, images = _mlp(), torch.randn(16, 64)
    expected, _ = _step(model, images)
    with RebuiltActivationsConfig().apply(model):
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True)
        compiled(images).square().mean().backward()
        got = [param.grad.clone() for param in model.parameters()]
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(got, expected))


def test_an_activation_changed_in_place_after_it_ran_is_an_error_not_a_wrong_gradient():
    net = nn.Sequential(nn.Linear(8, 8), nn.GELU(), nn.Linear(8, 8))
    RebuiltActivationsConfig().apply(net)
    hidden = net[0](torch.randn(4, 8))
    out = net[2](net[1](hidden))
    with torch.no_grad():
        hidden.mul_(2)  # what the GELU's own backward reads as well
    with pytest.raises(RuntimeError, match='rebuilt activations: the input of an activation'):
        out.sum().backward()


def test_bad_configurations_are_one_line_errors():
    with pytest.raises(ConfigError, match=r"types take a list, e\.g\. types=\['GELU'"):
        RebuiltActivationsConfig(types='GELU')
    with pytest.raises(ConfigError, match=r'found no activation of Sequential of the types '
                                          r'ReLU \(in place ones are left out\): give types='):
        RebuiltActivationsConfig(types=['ReLU']).apply(nn.Sequential(nn.Linear(2, 2)))
