"""DropIT draws from its own generator: with it, dropout and drop-path draw the same masks as
without it at the same seed, so the forward passes of a DropIT model and its baseline are
equal, step after step."""
from __future__ import annotations

import copy

import pytest
import timm
import torch
from torch import nn

from mmdropit.dropit import to_dropit
from mmdropit.common.random_source import reseed
from mmdropit.dropit.strategies import select


def _vit() -> nn.Module:
    return timm.create_model('vit_tiny_patch16_224', img_size=28, patch_size=7, in_chans=1,
                             embed_dim=96, depth=2, num_heads=3, num_classes=10, drop_rate=0.2,
                             drop_path_rate=0.2, proj_drop_rate=0.2)


def _wide_mlp() -> nn.Module:  # its first input (600 x 1024) is sampled for its threshold
    return nn.Sequential(nn.Linear(1024, 512), nn.GELU(), nn.Dropout(0.2), nn.Linear(512, 10))


def _outputs(model: nn.Module, inputs: torch.Tensor, steps: int = 2) -> list[torch.Tensor]:
    torch.manual_seed(7)
    outputs = []
    for _ in range(steps):
        out = model(inputs)
        out.square().mean().backward()
        outputs.append(out.detach())
    return outputs


@pytest.mark.parametrize('build,shape,strategy', [
    (_vit, (8, 1, 28, 28), 'random'),
    (_wide_mlp, (600, 1024), 'mink'),
    (_wide_mlp, (600, 1024), 'mink_approx'),
])
def test_dropout_and_drop_path_masks_match_the_baselines(build, shape, strategy):
    torch.manual_seed(0)
    baseline = build().train()
    dropit = to_dropit(copy.deepcopy(baseline), gamma=0.9, strategy=strategy, exclude=[])
    inputs = torch.randn(shape)
    reseed()
    for plain, sparse in zip(_outputs(baseline, inputs), _outputs(dropit, inputs)):
        torch.testing.assert_close(sparse, plain, rtol=0, atol=0)


def test_the_generator_follows_the_runs_seed():
    def drawn(seed: int) -> torch.Tensor:
        torch.manual_seed(seed)
        reseed()
        return select('random', torch.ones(1000), 0.5)[0]

    assert torch.equal(drawn(1), drawn(1)) and not torch.equal(drawn(1), drawn(2))
