"""Host cost of a checkpoint per block and step (stop 61): ours against torch's and timm's.

One thread, compute negligible, so host time is what is left: 24 tiny blocks (LayerNorm,
Linear 8x8, GELU, residual), each checkpointed by ``torch.utils.checkpoint`` or by our plan,
and a tiny timm ViT (embed 16, 24 blocks, 2 tokens + class token) checkpointed by timm's
``set_grad_checkpointing()`` or by our per-block plan. Prints, per block and step, the time
over the plain step (median over rounds, each the fastest of 5 steps, the variants alternated
within a round) and the Python function calls over the plain step's (cProfile: deterministic).

Run: .venv/bin/python docs/results/2026-11-29/checkpoint_host_cost_probe.py [rounds]
"""
from __future__ import annotations

import cProfile
import pstats
import statistics
import sys
import time

import torch
from timm.models.vision_transformer import VisionTransformer
from torch import nn
from torch.utils.checkpoint import checkpoint

from mmdropit.checkpoint import CheckpointPlan, ModuleTarget

BLOCKS = 24


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm, self.fc = nn.LayerNorm(8), nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + nn.functional.gelu(self.fc(self.norm(x)))


class _TorchCheckpointed(nn.Module):
    def __init__(self, block: nn.Module) -> None:
        super().__init__()
        self.block = block

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return checkpoint(self.block, x, use_reentrant=False)


def _tiny_blocks() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(*[_Block() for _ in range(BLOCKS)])


def _tiny_vit() -> VisionTransformer:
    torch.manual_seed(0)
    return VisionTransformer(img_size=32, patch_size=16, embed_dim=16, depth=BLOCKS,
                             num_heads=2, num_classes=4)


def _ours(model: nn.Module, prefix: str) -> nn.Module:
    CheckpointPlan([ModuleTarget(f'{prefix}{index}') for index in range(BLOCKS)]).apply(model)
    return model


def _fastest(model: nn.Module, x: torch.Tensor) -> float:
    for _ in range(2):
        model(x).sum().backward()
    times = []
    for _ in range(5):
        start = time.perf_counter()
        model(x).sum().backward()
        times.append(time.perf_counter() - start)
    return min(times)


def _calls(model: nn.Module, x: torch.Tensor, steps: int = 10) -> float:
    model(x).sum().backward()
    profile = cProfile.Profile()
    profile.enable()
    for _ in range(steps):
        model(x).sum().backward()
    profile.disable()
    return pstats.Stats(profile).total_calls / steps


def main(rounds: int) -> None:
    torch.set_num_threads(1)
    timm_vit = _tiny_vit()
    timm_vit.set_grad_checkpointing()
    cases = {
        'tiny blocks': (torch.randn(4, 8), _tiny_blocks(), {
            "torch's checkpoint": nn.Sequential(*[_TorchCheckpointed(b) for b in _tiny_blocks()]),
            'our plan': _ours(_tiny_blocks(), '')}),
        'tiny timm ViT': (torch.randn(2, 3, 32, 32), _tiny_vit(), {
            "timm's set_grad_checkpointing()": timm_vit,
            'our per-block plan': _ours(_tiny_vit(), 'blocks.')}),
    }
    for case, (x, plain, variants) in cases.items():
        over = {name: [] for name in variants}
        for _ in range(rounds):
            base = _fastest(plain, x)
            for name, model in variants.items():
                over[name].append((_fastest(model, x) - base) / BLOCKS)
        plain_calls = _calls(plain, x)
        for name, model in variants.items():
            calls = (_calls(model, x) - plain_calls) / BLOCKS
            print(f'{case}, {name}: {statistics.median(over[name]) * 1e6:.0f} us and '
                  f'{calls:.0f} Python calls per block and step over the plain step')


if __name__ == '__main__':
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 20)
