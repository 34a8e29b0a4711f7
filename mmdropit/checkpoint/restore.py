"""Put tensors back to the values they had: training state kept across a planning forward pass
or a recomputation.

Example:
    >>> counter = torch.zeros(2)
    >>> with values_restored([counter]):
    ...     counter += 1
    >>> counter.tolist()
    [0.0, 0.0]
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch


@contextlib.contextmanager
def values_restored(tensors: Iterable[torch.Tensor]) -> Iterator[None]:
    """Copy ``tensors`` on entry and write the copies back into them on exit."""
    saved = [(tensor, tensor.detach().clone()) for tensor in tensors]
    try:
        yield
    finally:
        with torch.no_grad():
            for tensor, value in saved:
                tensor.copy_(value)
