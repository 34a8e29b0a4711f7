"""A DropIT layer's host path stays lean: the operators it runs forward and backward (each one a
kernel launch on a GPU, host time on a host-bound step) are counted and bounded, and what it
works out once per input shape is not rebuilt at every call. Correctness only: no timings."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.overrides import TorchFunctionMode

from mmdropit import to_dropit
from mmdropit.bench.host_cost import count_layer_ops
from mmdropit.dropit import layers
from mmdropit.kernels import cpu as fused_cpu
from mmdropit.kernels.switch import eager_only

PLAIN = count_layer_ops(None)

# (strategy, fused): at most these many operators forward / backward, and syncs. The fused
# mink and random add one operator each way to the plain Linear's (keep_topk or keep_random,
# which draws its seed from the generator it is given; scatter_bitmask); the eager
# paths run the selection and bit packing as separate operators, fill mink's ties with a
# cumulative sum and find the kept indices with nonzero_static, reading no count back (no sync:
# issue 37).
BOUNDS = {
    ('mink', True): (PLAIN.forward + 1, PLAIN.backward + 1, 0),
    ('mink', False): (14, 7, 0),
    ('random', True): (PLAIN.forward + 1, PLAIN.backward + 1, 0),
    ('random', False): (9, 7, 0),
}


def test_the_plain_linear_runs_one_operator_forward_and_three_backward():
    assert (PLAIN.forward, PLAIN.backward, PLAIN.syncs) == (1, 3, 0)
    assert PLAIN.forward_names == ('aten::addmm',)


@pytest.mark.parametrize(('strategy', 'fused'), list(BOUNDS))
def test_a_dropit_linear_runs_no_more_operators_than_its_bound(strategy, fused):
    if fused and not fused_cpu.load():
        pytest.skip('the fused CPU kernels are not built')
    counts = count_layer_ops(strategy, fused=fused)
    forward, backward, syncs = BOUNDS[strategy, fused]
    assert counts.forward <= forward, counts.forward_names
    assert counts.backward <= backward, counts.backward_names
    assert counts.syncs <= syncs


@pytest.mark.parametrize(('strategy', 'selection'), [('mink', 'mmdropit_cpu::keep_topk'),
                                                     ('random', 'mmdropit_cpu::keep_random')])
def test_the_fused_strategies_add_their_two_kernels_alone(strategy, selection):
    """The node selects itself (``random`` drawing its seed inside its kernel): no operator
    runs for the selection but its kernel, none for a seed."""
    if not fused_cpu.load():
        pytest.skip('the fused CPU kernels are not built')
    counts = count_layer_ops(strategy, fused=True)
    assert counts.forward_names == (selection, 'aten::addmm')
    assert counts.backward_names == ('mmdropit_cpu::scatter_bitmask', 'aten::mm', 'aten::mm',
                                     'aten::sum')  # the weight's gradient first


def test_mink_approx_on_an_input_within_its_sample_runs_as_the_fused_mink():
    """On at most ``SAMPLE_SIZE`` elements ``mink_approx`` is ``mink``: its plan keeps a fixed
    count, which the node selects itself, with ``mink``'s operators (it was selected in Python
    and given to the node, at ~25 us more a layer); above the sample its count depends on the
    data."""
    from mmdropit.dropit.ops import SavePlan
    from mmdropit.dropit.strategies import SAMPLE_SIZE

    if not fused_cpu.load():
        pytest.skip('the fused CPU kernels are not built')
    small, large = torch.empty(SAMPLE_SIZE), torch.empty(SAMPLE_SIZE + 1)
    assert SavePlan(small, 0.9, 'mink_approx').fused_node
    assert not SavePlan(large, 0.9, 'mink_approx').fused_node
    approx, mink = count_layer_ops('mink_approx', fused=True), count_layer_ops('mink', fused=True)
    assert (approx.forward_names, approx.backward_names) == \
        (mink.forward_names, mink.backward_names)


@pytest.mark.parametrize(('strategy', 'selection'), [('mink', 'mmdropit_cpu::keep_topk'),
                                                     ('random', 'mmdropit_cpu::keep_random')])
def test_the_fused_convolution_adds_its_two_kernels_alone(strategy, selection):
    if not fused_cpu.load():
        pytest.skip('the fused CPU kernels are not built')
    counts = count_layer_ops(strategy, fused=True, layer_kind='conv')
    assert counts.forward_names == (selection, 'aten::convolution')
    assert counts.backward_names == ('mmdropit_cpu::scatter_bitmask',  # the weight's first
                                     'aten::convolution_backward', 'aten::convolution_backward')


class _ScaledConv2d(nn.Conv2d):
    """A convolution of its own (as weight-standardised ones are): ``_conv_forward`` differs."""

    def _conv_forward(self, input, weight, bias):  # noqa: A002  (nn.Conv2d's own names)
        return super()._conv_forward(input, 2 * weight, bias)


@pytest.mark.parametrize(('layer', 'routed'), [
    (nn.Linear(16, 8), False), (nn.Conv1d(4, 6, 3), False), (nn.Conv2d(4, 6, 3), False),
    (nn.Conv3d(4, 6, 3), False), (nn.Conv2d(4, 6, 3, padding_mode='reflect'), True),
    (_ScaledConv2d(4, 6, 3), True)])
def test_a_layer_running_its_classes_own_forward_calls_dropit_without_the_routing_mode(
        monkeypatch, layer, routed):
    """The routing mode (a TorchFunctionMode around the layer's forward) costs host time each
    call; a plain Linear or zero-padded convolution's forward is one call, made directly."""
    entered = []
    monkeypatch.setattr(layers._RouteOwnCall, '__enter__',
                        lambda mode: entered.append(mode) or TorchFunctionMode.__enter__(mode))
    to_dropit(layer, gamma=0.9, exclude=[])
    x = torch.randn(2, 16) if isinstance(layer, nn.Linear) else torch.randn(
        (2, 4) + (6,) * (layer.weight.dim() - 2))
    out = layer(x.requires_grad_())
    assert bool(entered) == routed
    if isinstance(layer, _ScaledConv2d):  # its own convolution ran, on the doubled weight
        assert out.grad_fn.name() == 'ConvolutionBackward0'
    else:
        assert 'DropIT' in out.grad_fn.name()


def _step(layer: nn.Module, x: torch.Tensor) -> None:
    layer(x).sum().backward()


def test_the_save_plan_is_made_once_per_input_shape_and_gamma():
    layer = to_dropit(nn.Linear(16, 8), gamma=0.9, exclude=[])
    x = torch.randn(4, 16, requires_grad=True)
    _step(layer, x)
    plan = layer.dropit.save_plan
    for _ in range(3):
        _step(layer, x)
    assert layer.dropit.save_plan is plan  # reused, layout included
    _step(layer, torch.randn(5, 16))
    assert layer.dropit.save_plan is not plan and layer.dropit.save_plan.numel == 80
    layer.dropit.gamma = 0.5
    _step(layer, torch.randn(5, 16))
    assert layer.dropit.save_plan.kept == 40


@pytest.mark.parametrize('fused', [True, False])
def test_a_reused_plan_saves_what_a_fresh_one_saves(fused):
    """Gradients of steps on a cached plan equal those of a layer seeing the shape first."""
    torch.manual_seed(0)
    layer = to_dropit(nn.Linear(16, 8), gamma=0.9, exclude=[])
    fresh = to_dropit(nn.Linear(16, 8), gamma=0.9, exclude=[])
    fresh.load_state_dict(layer.state_dict())
    first, second = torch.randn(6, 16), torch.randn(6, 16)
    with eager_only() if not fused else torch.enable_grad():
        _step(layer, first)
        layer.zero_grad()
        _step(layer, second)  # the plan made for `first`
        _step(fresh, second)
    assert torch.equal(layer.weight.grad, fresh.weight.grad)
    assert torch.equal(layer.bias.grad, fresh.bias.grad)


def test_the_host_cost_command_writes_its_table(tmp_path, capsys):
    from mmdropit.bench.host_cost import main
    path = tmp_path / 'host_cost.json'
    main(['--blocks', '2', '--rounds', '2', '--steps', '1', '--warmup', '1', '--layer', 'conv',
          '--strategies', 'mink', '--json', str(path)])
    out = capsys.readouterr().out
    assert '| mink-eager |' in out and 'Conv2d(16, 16, kernel_size=(3, 3)' in out
    import json
    rows = {row['variant']: row for row in json.loads(path.read_text())['rows']}
    assert set(rows) == {'plain', 'mink', 'mink-function', 'mink-eager'}
    assert rows['plain']['ratio_min'] == 1.0
