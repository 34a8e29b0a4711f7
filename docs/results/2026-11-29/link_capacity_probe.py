"""Plans with their inputs in host memory for links that carry fewer of them (stops 59, 60).

Records DeiT-S and ResNet-50 (timm, random weights, batch 2, fp32) on this CPU, and predicts
per-block checkpointing and the least-memory plan searched with the inputs on the host, for a
link that carries all, ten, eight or six block inputs of the per-block plan while the forward
pass runs (the bytes passed as ``host_capacity``). Prints the activation peak as a share of the
unplanned one, how many checkpoints move their inputs, and the recompute as a share of the
forward pass. Predictions only.

Run: .venv/bin/python docs/results/2026-11-29/link_capacity_probe.py
"""
from __future__ import annotations

import timm
import torch

from mmdropit.checkpoint import build_chain, per_block_plan, plan_for_chain, record_step


def main() -> None:
    for name in ('deit_small_patch16_224', 'resnet50'):
        torch.manual_seed(0)
        model = timm.create_model(name, num_classes=10)
        x, y = torch.randn(2, 3, 224, 224), torch.tensor([1, 2])
        step = lambda: torch.nn.functional.cross_entropy(model(x), y)  # noqa: E731
        chain = build_chain(record_step(model, step), model)
        block = per_block_plan(chain, model)
        every = block.with_inputs_on_host(chain)
        inputs = every.planned.host_bytes / max(len(every.planned.host_checkpoints), 1)
        print(f'{name}: {len(block.targets)} blocks, per-block on the device '
              f'{block.activation_share:.3f} of the activations')
        for carried in (None, 10, 8, 6):
            capacity = None if carried is None else (carried + 0.5) * inputs
            hosted = block.with_inputs_on_host(chain, capacity)
            least = plan_for_chain(chain, None, inputs_on_host=True, host_capacity=capacity)
            share = least.planned.recompute_seconds / max(least.forward_seconds, 1e-9)
            label = 'all' if carried is None else f'{carried} inputs'
            print(f'  link carries {label:>9}: per-block {hosted.activation_share:.3f} '
                  f'({len(hosted.planned.host_checkpoints)} move); least '
                  f'{least.activation_share:.3f} ({len(least.planned.host_checkpoints)} of '
                  f'{len(least.targets)} move, recompute {share:.2f} of the forward pass)')


if __name__ == '__main__':
    main()
