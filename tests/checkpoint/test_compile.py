"""Checkpoint plans under ``torch.compile``: plain, selective and nested plans trace in one
graph with no break, and the compiled step's gradients equal the eager step's."""
from __future__ import annotations

import copy

import pytest
import timm
import torch
import torch._dynamo
from torch import nn

from mmdropit.checkpoint import CheckpointPlan, ModuleTarget, RunTarget

PLANS = {
    'plain': [RunTarget('blocks', 0, 1), ModuleTarget('blocks.2')],
    'selective': [ModuleTarget('blocks.0', selective=True), ModuleTarget('blocks.2.mlp',
                                                                         selective=True)],
    'nested': [RunTarget('blocks', 0, 2, inner=(ModuleTarget('blocks.1', selective=True),))],
}


def _vit() -> nn.Module:
    return timm.create_model('vit_tiny_patch16_224', img_size=28, patch_size=7, in_chans=1,
                             embed_dim=96, depth=4, num_heads=3, num_classes=10, drop_rate=0.1)


def _loss(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    return model(images).logsumexp(1).mean()


@pytest.mark.parametrize('kind', PLANS)
def test_a_planned_model_is_one_graph_with_the_eager_gradients(kind):
    torch.manual_seed(0)
    eager = CheckpointPlan(targets=PLANS[kind]).apply(_vit())
    compiled = copy.deepcopy(eager)
    images = torch.randn(8, 1, 28, 28)
    explained = torch._dynamo.explain(_loss)(compiled, images)
    assert explained.graph_break_count == 0, explained.break_reasons
    torch.manual_seed(1)
    _loss(eager, images).backward()
    torch._dynamo.reset()
    step = torch.compile(_loss, backend='aot_eager', fullgraph=True, dynamic=False)
    torch.manual_seed(1)
    step(compiled, images).backward()
    for (name, expected), got in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(got.grad, expected.grad, rtol=1e-5, atol=1e-6, msg=name)
