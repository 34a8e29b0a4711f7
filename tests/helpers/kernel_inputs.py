"""Inputs that stress DropIT's selection kernels: ordinary, many ties, mostly zeros, channels of
very different scales."""
from __future__ import annotations

import torch

KINDS = ('normal', 'ties', 'mostly_zero', 'scaled')


def kernel_input(numel: int, dtype: torch.dtype, kind: str, device: str = 'cpu') -> torch.Tensor:
    """A flat input of ``numel`` elements, seeded by ``numel``, of the given ``kind``."""
    x = torch.randn(numel, generator=torch.Generator().manual_seed(numel))
    if kind == 'ties':  # a third exact zeros, and many copies of one value
        x[::3] = 0
        x[1::7] = x[min(1, numel - 1)]
    elif kind == 'mostly_zero':  # the threshold is 0 itself: the bracket cannot hold it
        x[torch.arange(numel) % 20 != 0] = 0
    elif kind == 'scaled':  # channels of very different scales, as in a transformer
        x = x * torch.logspace(-3, 3, 16).repeat(numel // 16 + 1)[:numel]
    return x.to(device, dtype)
