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
