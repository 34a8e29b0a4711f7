"""Checkpoint plans under ``torch.compile``: plain, selective, nested and sibling-run plans trace
in one graph with no break, and the compiled step's gradients equal the eager step's."""
from __future__ import annotations

import copy
import threading

import pytest
import timm
import torch
import torch._dynamo
from torch import nn

from mmdropit.checkpoint import CheckpointPlan, ModuleTarget, RunTarget, SiblingsTarget

PLANS = {
    'plain': [RunTarget('blocks', 0, 1), ModuleTarget('blocks.2')],
    'selective': [ModuleTarget('blocks.0', selective=True), ModuleTarget('blocks.2.mlp',
                                                                         selective=True)],
    'nested': [RunTarget('blocks', 0, 2, inner=(ModuleTarget('blocks.1', selective=True),))],
    'siblings': [SiblingsTarget('blocks.0.mlp', ('fc1', 'act')),
                 SiblingsTarget('blocks.1', ('attn', 'ls1', 'drop_path1'), inner=(
                     ModuleTarget('blocks.1.attn.qkv'),))],
}


def _vit() -> nn.Module:
    return timm.create_model('vit_tiny_patch16_224', img_size=28, patch_size=7, in_chans=1,
                             embed_dim=96, depth=4, num_heads=3, num_classes=10, drop_rate=0.1)


def _loss(model: nn.Module, images: torch.Tensor) -> torch.Tensor:
    return model(images).logsumexp(1).mean()


@pytest.mark.parametrize('kind', PLANS)
def test_a_planned_model_is_one_graph_with_the_eager_gradients(kind):
    torch.manual_seed(0)
    eager = _vit()
    CheckpointPlan(targets=PLANS[kind]).apply(eager)
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


def test_a_thread_that_ran_no_checkpoint_compiles_a_plan_in_one_graph():
    """The region marks are thread-local: on a thread where no checkpoint ran before (a fresh
    process, a plan loaded on resume), dynamo failed on reading a mark not set yet and ran each
    checkpoint's region outside the graph (three breaks here)."""
    model = _vit()
    CheckpointPlan(targets=PLANS['plain']).apply(model)
    explained = []
    thread = threading.Thread(target=lambda: explained.append(
        torch._dynamo.explain(_loss)(model, torch.randn(2, 1, 28, 28))))
    thread.start()
    thread.join()
    assert explained[0].graph_break_count == 0, explained[0].break_reasons


def test_compiled_recomputation_updates_batchnorm_statistics_once():
    torch.manual_seed(0)
    planned = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                            nn.Conv2d(8, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                            nn.Flatten(), nn.Linear(8 * 16 * 16, 10))
    plain = copy.deepcopy(planned)
    CheckpointPlan(targets=[RunTarget('', 0, 5)]).apply(planned)
    images = torch.randn(4, 3, 16, 16)
    plain(images).sum().backward()
    torch._dynamo.reset()
    step = torch.compile(lambda model, x: model(x).sum(), backend='aot_eager', fullgraph=True)
    step(planned, images).backward()
    for index in (1, 4):
        assert torch.equal(planned[index].running_mean, plain[index].running_mean)
        assert planned[index].num_batches_tracked.item() == 1
