"""Activation offload on a machine without a GPU: the hooks go on and off cleanly, nothing
moves, training is unchanged, and modules are chosen by their share of the saved bytes."""
from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from mmdropit.common.recompute_region import recomputed_region
from mmdropit.errors import ConfigError
from mmdropit.memory import SavedTensorMeter
from mmdropit.offload import (link_bytes_per_second, modules_holding_share,
                              offload_activations, restore_offload)
from tests.helpers.keyword_loop import KeywordLoop
from tests.helpers.torch_checkpointed import TorchCheckpointed


def _mlp(blocks: int = 8) -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
                           for _ in range(blocks)])


def _grads(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad()
    model(x).square().mean().backward()
    return [param.grad.clone() for param in model.parameters()]


@pytest.mark.parametrize('method', ['prefetch', 'save_on_cpu'])
def test_offloaded_modules_train_as_before_and_nothing_moves_on_cpu(method):
    model, x = _mlp(), torch.randn(32, 64)
    with SavedTensorMeter(model) as plain:
        expected = _grads(model, x)
    offload = offload_activations(model, ['0', '3.*'], method)
    assert offload.names == ['0', '3.0', '3.1', '3.2']
    with SavedTensorMeter(model) as meter:
        got = _grads(model, x)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert offload.copies.stats.bytes_moved == 0
    if method == 'prefetch':  # what stays where it is is still counted as saved
        assert meter.result.total_bytes == plain.result.total_bytes
    assert restore_offload(model) == offload.names
    assert not any(module._forward_pre_hooks or module._forward_hooks
                   for module in model.modules())
    assert restore_offload(model) == []


def test_bad_offload_settings_are_one_line_errors():
    model = _mlp(2)
    with pytest.raises(ConfigError, match="use one of prefetch, save_on_cpu"):
        offload_activations(model, ['0'], 'disk')
    with pytest.raises(ConfigError, match='found no module of Sequential matching'):
        offload_activations(model, ['blocks.*'])
    offload_activations(model, ['0'])
    with pytest.raises(ConfigError, match='offloaded already'):
        offload_activations(model, ['1'])
    with pytest.raises(ConfigError, match=r'share must be in \(0, 1\]'):
        modules_holding_share(model, lambda: model(torch.randn(2, 64)).sum(), ['*'], 0)


def test_offload_steps_aside_where_a_checkpoint_recomputes():
    model = _mlp(2)
    offload = offload_activations(model, ['0'])
    with recomputed_region():
        assert type(offload.context()).__name__ == 'nullcontext'
    assert type(offload.context()).__name__ == '_GeneratorContextManager'


@pytest.mark.parametrize('reentrant', [False, True])
@pytest.mark.parametrize('method', ['prefetch', 'save_on_cpu'])
def test_offload_steps_aside_inside_a_models_own_checkpoint(method, reentrant):
    """The offloaded modules' hooks, the innermost, kept what the model's own checkpoint drops
    (and would copy it to the host on a GPU), and a reentrant checkpoint's recomputation, inside
    the backward pass, would copy what that backward reads at once: there they step aside, and
    the forward keeps what checkpointing alone keeps."""
    # a reentrant checkpoint gives its parameters gradients only for an input that needs one
    model, x = _mlp(4), torch.randn(32, 64, requires_grad=True)
    model[0], model[1] = (TorchCheckpointed(model[0], reentrant),
                          TorchCheckpointed(model[1], reentrant))
    with SavedTensorMeter(model) as plain:
        expected = _grads(model, x)
    offload = offload_activations(model, ['0.module', '1.module'], method)
    contexts = []
    context = offload.context
    offload.context = lambda: (contexts.append(context()), contexts[-1])[1]
    with SavedTensorMeter(model) as meter:
        got = _grads(model, x)
    assert all(torch.equal(a, b) for a, b in zip(got, expected))
    assert meter.result.total_bytes == plain.result.total_bytes
    assert len(contexts) == 4  # two modules, each in the first pass and the recomputation
    names = [type(each).__name__ for each in contexts]
    # a reentrant first pass runs without autograd: its hooks see nothing
    assert set(names[2:] if reentrant else names) == {'nullcontext'}


def test_a_forward_that_raises_leaves_no_hook_behind():
    model = _mlp(2)
    offload_activations(model, ['0'], 'save_on_cpu')
    with pytest.raises(RuntimeError):
        model(torch.randn(4, 3))  # wrong width: raises inside the offloaded module
    with SavedTensorMeter(model) as meter:  # an inner hook left open would hide the saves
        model(torch.randn(4, 64)).sum().backward()
    assert meter.result.total_bytes > 0


def test_the_earliest_blocks_holding_the_share_are_chosen():
    model = _mlp(8)
    x = torch.randn(32, 64)
    forward = lambda: model(x).square().mean()
    # each block saves 9/73 of the step (its input, GELU's input and output); the loss the rest
    assert modules_holding_share(model, forward, ['*'], 0.45) == ['0', '1', '2', '3']
    assert modules_holding_share(model, forward, ['*'], 0.5) == ['0', '1', '2', '3', '4']
    assert modules_holding_share(model, forward, ['*'], 0.3) == ['0', '1', '2']
    assert modules_holding_share(model, forward, ['*'], 1.0) == [str(i) for i in range(8)]
    assert modules_holding_share(model, forward, ['5.*'], 0.5) == ['5.0', '5.1', '5.2']


def test_by_default_the_blocks_of_a_list_the_step_chains_are_chosen_one_by_one():
    """Without candidates the model's repeated blocks are: those of a list of blocks inside a
    called module (mmdet's Swin stages, DETR's layers), when the step calls them one after
    another; its outermost modules only where it has no repeated blocks."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(64, 64), KeywordLoop(_mlp(6), 'input'), nn.Linear(64, 8))
    x = torch.randn(32, 64)
    forward = lambda: model(x).square().mean()
    assert modules_holding_share(model, forward, ['*'], 0.5) == ['0', '1']
    assert modules_holding_share(model, forward, None, 0.5) == [f'1.blocks.{index}'
                                                               for index in range(4)]
    flat = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 64))
    assert modules_holding_share(flat, lambda: flat(x).sum(), None, 0.5) == ['0', '1']


def test_no_more_is_offloaded_than_the_host_link_moves_in_a_forward_pass():
    """The share is capped at the bytes the link copies while the forward pass runs: a link of
    one byte a second hides nothing (the first block is still taken), a link as fast as the
    step's saved bytes per forward time hides them all."""
    model = _mlp()
    x = torch.randn(32, 64)
    forward = lambda: model(x).square().mean()
    assert modules_holding_share(model, forward, ['*'], 0.5, link_bytes_per_second=1.0) == ['0']
    assert len(modules_holding_share(model, forward, ['*'], 0.5,
                                     link_bytes_per_second=1e15)) == 5
    assert link_bytes_per_second(torch.device('cpu')) == math.inf
