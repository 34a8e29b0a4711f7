"""Put training state back as it was: tensors' values, and the model's buffers and RNG streams
around a pass that must leave no trace (a planning forward pass, a trial pass, a recomputation).

Example:
    >>> counter = torch.zeros(2)
    >>> with values_restored([counter]):
    ...     counter += 1
    >>> counter.tolist()
    [0.0, 0.0]
    >>> from torch import nn
    >>> net = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Dropout(0.5))
    >>> first = torch.rand(1)
    >>> with preserved_training_state(net):
    ...     _ = net(torch.randn(8, 4))   # updates BatchNorm statistics, draws dropout masks
    >>> net[1].running_mean.abs().sum().item(), int(net[1].num_batches_tracked)
    (0.0, 0)
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator

import torch
from torch import nn


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


@contextlib.contextmanager
def preserved_training_state(model: nn.Module) -> Iterator[None]:
    """Restore the model's buffers (e.g. BatchNorm statistics) and the RNG states on exit."""
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices), values_restored(model.buffers()):
        yield
