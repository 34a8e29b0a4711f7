"""Inputs that stress the fused kernels: DropIT's selection (ordinary, many ties, mostly zeros,
channels of very different scales) and the lean activations' derivative codes (values on the
table's boundaries, infinities, NaNs)."""
from __future__ import annotations

import torch

from mmdropit.codecs.derivative_codes import DerivativeTable, derivative_table

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


def derivative_table_on(kind: str, like: torch.Tensor) -> DerivativeTable:
    """The derivative table of ``kind`` on ``like``'s device in its dtype, as the lean
    activations pass it to the kernels."""
    table = derivative_table(kind)
    return DerivativeTable(table.boundaries.to(like.device, like.dtype),
                           table.values.to(like.device, like.dtype), table.rms_error)


def derivative_code_input(numel: int, dtype: torch.dtype, kind: str,
                          device: str = 'cpu') -> torch.Tensor:
    """A flat input of ``numel`` elements for the derivative codes of ``kind``: normal values
    times 3, every fifth on one of the table's boundaries (in ``dtype``), and an infinity of
    each sign and a NaN where the size allows."""
    x = kernel_input(numel, dtype, 'normal', device) * 3
    boundaries = derivative_table_on(kind, x).boundaries
    x[::5] = boundaries.repeat(numel // (5 * boundaries.numel()) + 1)[:x[::5].numel()]
    for index, special in zip((1, 2, 3), (float('inf'), -float('inf'), float('nan'))):
        if index < numel:
            x[index] = special
    return x
