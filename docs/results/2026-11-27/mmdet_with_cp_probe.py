"""mmdet's ResNet-18 with and without its own per-block checkpointing (``with_cp=True``:
``torch.utils.checkpoint``, reentrant) under DropIT (each strategy), int8 activations and
activation offload: the bytes the forward saves and the largest gradient error against the
plain model without checkpoints (stop 47).

    python docs/results/2026-11-27/mmdet_with_cp_probe.py
"""
import warnings

import torch
from mmdet.models.backbones import ResNet

from mmdropit.codecs import compress_activations
from mmdropit.dropit import to_dropit
from mmdropit.offload import block_patterns, offload_activations

warnings.simplefilter('ignore')
x = torch.randn(4, 3, 96, 96)


def build(with_cp: bool) -> ResNet:
    torch.manual_seed(0)
    model = ResNet(depth=18, with_cp=with_cp)
    model.train()  # mmdet's ResNet.train returns nothing
    return model


def step(model: ResNet) -> tuple[list[torch.Tensor], int]:
    """The parameters' gradients of one step and the bytes its forward saved."""
    saved = [0]

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        saved[0] += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = sum(out.square().mean() for out in model(x))
    loss.backward()
    return [p.grad for p in model.parameters()], saved[0]


reference, _ = step(build(False))
for what in ('none', 'dropit mink', 'dropit mink_approx', 'dropit random', 'int8', 'offload'):
    for with_cp in (False, True):
        model = build(with_cp)
        if what.startswith('dropit'):
            to_dropit(model, gamma=0.9, strategy=what.split()[1])
        elif what == 'int8':
            compress_activations(model, bits=8)
        elif what == 'offload':
            offload_activations(model, block_patterns(model))
        grads, saved = step(model)
        error = max(float((g - r).norm() / r.norm()) for g, r in zip(grads, reference))
        print(f'{what:19} with_cp={with_cp!s:5} forward saved {saved / 2**20:5.1f} MiB, '
              f'largest relative gradient error {error:.1e}')
