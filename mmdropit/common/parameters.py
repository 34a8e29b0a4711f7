"""Parameters as one process holds them: the local part of a sharded tensor, and the order in
which an optimizer numbers its parameters.

Example:
    >>> from torch import nn
    >>> net = nn.Linear(4, 2)
    >>> optimizer = torch.optim.SGD([{'params': [net.bias]}, {'params': [net.weight]}], lr=0.1)
    >>> [tuple(p.shape) for p in optimizer_params(optimizer)]
    [(2,), (2, 4)]
    >>> local_part(net.weight) is net.weight   # not sharded: the tensor itself
    True
    >>> is_sharded(net.parameters())
    False
    >>> model_device(net).type
    'cpu'
"""
from __future__ import annotations

from collections.abc import Iterable

import torch
from torch import nn
from torch.distributed.tensor import DTensor


def local_part(tensor: torch.Tensor) -> torch.Tensor:
    """This process's part of a tensor: the local shard of an FSDP2 ``DTensor`` parameter."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def is_sharded(tensors: Iterable[torch.Tensor]) -> bool:
    """Whether any of ``tensors`` is an FSDP2 shard (a ``DTensor``)."""
    return any(isinstance(tensor, DTensor) for tensor in tensors)


def model_device(model: nn.Module) -> torch.device:
    """Where ``model`` runs: the device of its first parameter (the CPU for a model without
    parameters)."""
    first = next(iter(model.parameters()), None)
    return first.device if first is not None else torch.device('cpu')


def optimizer_params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The optimizer's parameters in ``Optimizer.state_dict`` index order."""
    return [param for group in optimizer.param_groups for param in group['params']]
