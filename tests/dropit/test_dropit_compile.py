"""DropIT under ``torch.compile``: the fixed-count strategies' custom operators let dynamo trace
a DropIT model in one graph, and the compiled step's gradients equal the eager step's."""
from __future__ import annotations

import copy

import pytest
import timm
import torch
import torch._dynamo
import torch._dynamo.testing
from torch import nn
from torch.utils.checkpoint import checkpoint

from mmdropit.checkpoint import checkpoint_module
from mmdropit.dropit import keep_ratio, to_dropit


def _vit() -> nn.Module:
    return timm.create_model('vit_tiny_patch16_224', img_size=28, patch_size=7, in_chans=1,
                             embed_dim=96, depth=2, num_heads=3, num_classes=10)


def _cnn() -> nn.Module:
    return nn.Sequential(nn.Conv2d(1, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.Conv2d(16, 32, 3, stride=2), nn.ReLU(), nn.Flatten(),
                         nn.Linear(32 * 13 * 13, 10))


def _loss(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    return model(images).logsumexp(1).mean()


@pytest.mark.parametrize('build', [_vit, _cnn])
@pytest.mark.parametrize('strategy', ['mink', 'random'])
def test_a_dropit_model_is_one_graph(build, strategy):
    torch.manual_seed(0)
    model = to_dropit(build(), gamma=0.9, strategy=strategy, exclude=[])
    explained = torch._dynamo.explain(_loss)(model, torch.randn(4, 1, 28, 28))
    assert explained.graph_break_count == 0, explained.break_reasons
    assert explained.graph_count == 1


def test_later_steps_reuse_the_compiled_graph_and_still_count():
    """The layers' counters are a tensor the graph adds to; as Python ints they made dynamo
    guard on their values and recompile at every step (then fall back to eager)."""
    torch.manual_seed(0)
    model = to_dropit(_vit(), gamma=0.9, exclude=[])
    torch._dynamo.reset()
    compiler = torch._dynamo.testing.CompileCounter()
    step = torch.compile(_loss, backend=compiler, fullgraph=True, dynamic=False)
    for _ in range(2):  # DropITHook reads and resets the counters at each logged iteration
        for _ in range(3):
            step(model, torch.randn(4, 1, 28, 28)).backward()
        assert keep_ratio(model, reset=True) == pytest.approx(0.1, abs=0.01)
    assert compiler.frame_count == 1


@pytest.mark.parametrize('build', [_vit, _cnn])
def test_compiled_gradients_equal_the_eager_ones(build):
    torch.manual_seed(0)
    eager = to_dropit(build(), gamma=0.9, exclude=[])
    compiled = copy.deepcopy(eager)
    images = torch.randn(4, 1, 28, 28)
    _loss(eager, images).backward()
    torch._dynamo.reset()
    step = torch.compile(_loss, backend='aot_eager', fullgraph=True, dynamic=False)
    step(compiled, images).backward()
    assert keep_ratio(compiled) == pytest.approx(0.1, abs=0.01)
    for (name, expected), got in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(got.grad, expected.grad, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize('layer', [nn.Linear(16, 16), nn.Conv2d(4, 8, 3)], ids=['linear', 'conv'])
def test_a_dropit_layer_checkpointed_alone_is_one_graph(layer):
    """A DropIT layer with nn.Linear's / nn.ConvNd's own forward calls its Function directly, a
    fact read from its class: dynamo evaluated the ``super()`` test that finds it to ``None``,
    and the layer took the routing mode, which a checkpoint region refuses (a mode pushed inside
    it is a side effect outside it)."""
    torch.manual_seed(0)
    layer = to_dropit(layer, gamma=0.9, exclude=[])
    x = torch.randn(2, 16) if isinstance(layer, nn.Linear) else torch.randn(2, 4, 8, 8)

    def loss(inputs: torch.Tensor) -> torch.Tensor:
        return checkpoint(layer, inputs, use_reentrant=False).square().mean()

    torch._dynamo.reset()
    torch.compile(loss, backend='aot_eager', fullgraph=True)(x).backward()
    assert layer.weight.grad is not None


class _ScaledLinear(nn.Linear):
    """A Linear with a forward of its own: DropIT routes its call through a mode."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * 0.5


def test_a_checkpoint_dynamo_cannot_trace_trains_in_a_compiled_step():
    """A checkpoint region that falls back to eager (the routing mode breaks it) inside a step
    that calls ``backward`` itself, as MMEngine's compiled ``train_step`` does: the DropIT
    Function's backward, run eagerly, is not compiled as a frame of its own (its guard on
    ``ctx.saved_tensors`` unpacked the checkpoint's tensors twice: ``CheckpointError``), and the
    gradients are the eager step's."""
    torch.manual_seed(0)
    eager = to_dropit(nn.Sequential(_ScaledLinear(16, 32), nn.GELU(), _ScaledLinear(32, 8)),
                      gamma=0.9, exclude=[])
    checkpoint_module(eager)
    compiled = copy.deepcopy(eager)
    x = torch.randn(6, 16)

    def step(model: nn.Module) -> torch.Tensor:
        loss = model(x).square().mean()
        loss.backward()
        return loss.detach()

    step(eager)
    torch._dynamo.reset()
    torch.compile(step, backend='aot_eager', dynamic=False)(compiled)
    for (name, expected), got in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(got.grad, expected.grad, msg=name)
