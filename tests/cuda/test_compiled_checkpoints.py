"""DropIT inside compiled checkpoint regions: a model whose DropIT blocks are checkpointed
compiles in one graph and its gradients equal the eager step's, on the CPU and, with the Triton
selection inside the regions, on a GPU (``pytest -m cuda``: the GPU run's ``tests`` stage)."""
from __future__ import annotations

import copy

import pytest
import torch
import torch._dynamo
from torch import nn

from mmdropit.checkpoint import checkpoint_module
from mmdropit.dropit import keep_ratio, to_dropit

CUDA = pytest.param('cuda', marks=[pytest.mark.cuda, pytest.mark.skipif(
    not torch.cuda.is_available(), reason='needs a CUDA device')])


@pytest.mark.parametrize('device', ['cpu', CUDA])
def test_checkpointed_dropit_blocks_compile_to_the_eager_gradients(device):
    torch.manual_seed(0)
    eager = to_dropit(nn.Sequential(*[nn.Sequential(nn.Linear(64, 64), nn.GELU())
                                      for _ in range(3)], nn.Linear(64, 10)).to(device),
                      gamma=0.9, exclude=[])
    for block in eager[:3]:
        checkpoint_module(block)
    compiled = copy.deepcopy(eager)
    x = torch.randn(32, 64, device=device)

    def loss(model: nn.Module) -> torch.Tensor:
        return model(x).square().mean()

    loss(eager).backward()
    torch._dynamo.reset()
    explained = torch._dynamo.explain(loss)(compiled)
    assert explained.graph_count == 1 and explained.graph_break_count == 0, \
        explained.break_reasons
    compiled.zero_grad(set_to_none=True)
    keep_ratio(compiled, reset=True)
    torch._dynamo.reset()
    torch.compile(loss, backend='aot_eager', fullgraph=True)(compiled).backward()
    assert keep_ratio(compiled) == pytest.approx(0.1, abs=0.01)
    for (name, expected), got in zip(eager.named_parameters(), compiled.parameters()):
        torch.testing.assert_close(got.grad, expected.grad, msg=name)
