"""Inside a checkpoint's region (ours, or ``torch.utils.checkpoint`` called by the model) a
DropIT layer selects once per step, in the recomputation: the first forward pass, whose saved
tensors the checkpoint drops, saves placeholders."""
from __future__ import annotations

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from mmdropit import from_dropit, to_dropit
from mmdropit.checkpoint.apply import checkpoint_module, checkpoint_run, uncheckpoint
from mmdropit.dropit.strategies import SAMPLE_SIZE
from tests.helpers.torch_checkpointed import TorchCheckpointed


def _model() -> nn.Sequential:
    torch.manual_seed(0)
    inner = nn.Sequential(nn.Linear(128, 128), nn.GELU(), nn.Linear(128, 128))
    return nn.Sequential(nn.Linear(64, 128), nn.GELU(), inner, nn.GELU(), nn.Linear(128, 10))


def _step(model: nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
    model.zero_grad()
    model(x).square().mean().backward()
    return [p.grad.clone() for p in model.parameters()]


class SelectionCounter(TorchDispatchMode):
    """Counts DropIT's selections (calls of the operator ``mmdropit::keep``)."""

    def __init__(self):
        super().__init__()
        self.calls = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.calls += func is torch.ops.mmdropit.keep.default
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize('nested', [False, True])
@pytest.mark.parametrize('fused', ['1', '0'])
def test_each_layer_selects_once_and_gradients_are_unchanged(nested, fused, monkeypatch):
    monkeypatch.setenv('MMDROPIT_FUSED', fused)
    model = to_dropit(_model(), gamma=0.9)
    x = torch.randn(32, 64)
    with SelectionCounter() as unplanned_count:
        unplanned = _step(model, x)
    checkpoint_run(model, 0, 3)
    if nested:
        checkpoint_module(model[2])
    with SelectionCounter() as planned_count:
        planned = _step(model, x)
    for module in model.modules():
        uncheckpoint(module)
    from_dropit(model)
    assert unplanned_count.calls == 3  # the first Linear is not converted
    assert planned_count.calls == 3  # without placeholders: 5 (plain) or 7 (nested)
    for got, want in zip(planned, unplanned):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('outer_selective', [False, True])
def test_selective_checkpoints_replay_dropit_selections(outer_selective):
    """A selective checkpoint replays its first pass's ops in order in the recomputation, so a
    DropIT layer selects in both passes there (with placeholders torch raised "mmdropit.keep
    encountered during backward but not found in storage"); nested either way round."""
    model = to_dropit(_model(), gamma=0.9)
    x = torch.randn(32, 64)
    unplanned = _step(model, x)
    checkpoint_run(model, 0, 3, selective=outer_selective)
    checkpoint_module(model[2], selective=not outer_selective)
    planned = _step(model, x)
    for module in model.modules():
        uncheckpoint(module)
    for got, want in zip(planned, unplanned):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('strategy', ['mink', 'random'])
@pytest.mark.parametrize('fused', ['1', '0'])
def test_inside_a_models_own_checkpoint_each_layer_selects_once(strategy, fused, monkeypatch):
    """The first pass of ``torch.utils.checkpoint`` drops what is saved: DropIT saves
    placeholders there (the two layers inside selected twice: 5 selections a step) and the same
    gradients come out (``mink``: those of the step without the checkpoint)."""
    monkeypatch.setenv('MMDROPIT_FUSED', fused)
    model = to_dropit(_model(), gamma=0.9, strategy=strategy)
    x = torch.randn(32, 64)
    unplanned = _step(model, x)
    model[2] = TorchCheckpointed(model[2])
    with SelectionCounter() as planned_count:
        planned = _step(model, x)
    assert planned_count.calls == 3
    if strategy == 'mink':
        for got, want in zip(planned, unplanned):
            torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize('checkpoints', ['ours', 'torch'])
@pytest.mark.parametrize('fused', ['1', '0'])
def test_inside_a_checkpoint_mink_approx_keeps_the_count_of_mink(checkpoints, fused,
                                                                   monkeypatch):
    """``mink_approx`` keeps a count that depends on its random sample, so a checkpoint's two
    passes kept two counts and ``torch.utils.checkpoint`` raised ``CheckpointError`` (the
    recomputation's saved tensors had other shapes). Inside a plain checkpoint it selects as
    ``mink``: the checkpointed layers' gradients are ``mink``'s."""
    monkeypatch.setenv('MMDROPIT_FUSED', fused)
    x = torch.randn(640, 64)  # 81,920 elements into each inner Linear: above the sample
    assert x.shape[0] * 128 > SAMPLE_SIZE
    exact = to_dropit(_model(), gamma=0.9, strategy='mink')
    _step(exact, x)
    model = to_dropit(_model(), gamma=0.9, strategy='mink_approx')
    inner = model[2]
    if checkpoints == 'ours':
        checkpoint_module(inner)
    else:
        model[2] = TorchCheckpointed(inner)
    _step(model, x)
    for got, want in zip(inner.parameters(), exact[2].parameters()):
        torch.testing.assert_close(got.grad, want.grad, rtol=1e-5, atol=1e-6)
