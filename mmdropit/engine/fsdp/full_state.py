"""Full (unsharded, plain-tensor) state dicts for FSDP2-sharded models and their optimizers.

Checkpoints hold what a non-sharded model holds: plain tensors under the usual keys, and the
optimizer state keyed by parameter index as ``torch.optim.Optimizer.state_dict`` numbers it. So
an FSDP2 checkpoint loads into a plain model (``load_state_dict(strict=True)``), resumes a DDP
run, and a DDP checkpoint resumes an FSDP2 run. Gathering is a collective: every rank calls.

Example::

    state = gather_optimizer_state(optimizer)        # every rank; plain CPU tensors
    optimizer.load_state_dict(shard_optimizer_state(optimizer, state))
"""
from __future__ import annotations

from typing import Any

import torch
from torch import nn
from torch.distributed.tensor import DTensor, distribute_tensor

from ...common.parameters import optimizer_params


def gather_tensor(value: Any) -> Any:
    """``value`` as a full plain CPU tensor if it is a tensor (a collective for a DTensor)."""
    if isinstance(value, DTensor):
        return value.full_tensor().cpu()
    return value.cpu() if isinstance(value, torch.Tensor) else value


def shard_like(value: torch.Tensor, like: DTensor) -> DTensor:
    """Cut the full tensor ``value`` (the same on every rank) into ``like``'s sharding, locally."""
    return distribute_tensor(value.to(like.device), like.device_mesh, like.placements,
                             src_data_rank=None)


def shard_model_state(module: nn.Module, state_dict: dict, prefix: str = '') -> None:
    """Replace, in place, the plain tensors of ``state_dict`` that belong to DTensor parameters
    or buffers of ``module`` (keys ``prefix + name``) by this rank's shards."""
    for name, tensor in [*module.named_parameters(), *module.named_buffers()]:
        value = state_dict.get(prefix + name)
        if (isinstance(tensor, DTensor) and isinstance(value, torch.Tensor)
                and not isinstance(value, DTensor)):
            state_dict[prefix + name] = shard_like(value, tensor)


def gather_optimizer_state(optimizer: torch.optim.Optimizer) -> dict:
    """``optimizer.state_dict()`` with every sharded state gathered to a plain CPU tensor."""
    state = optimizer.state_dict()
    gathered = {index: {key: gather_tensor(value) for key, value in entry.items()}
                for index, entry in state['state'].items()}
    return {**state, 'state': gathered}


def shard_optimizer_state(optimizer: torch.optim.Optimizer, state: dict) -> dict:
    """A full optimizer ``state`` (see :func:`gather_optimizer_state`) cut into this rank's
    shards: each plain tensor shaped like its DTensor parameter becomes a shard of it."""
    params = optimizer_params(optimizer)
    sharded = {}
    for index, entry in state['state'].items():
        param = params[index] if isinstance(index, int) and index < len(params) else None
        sharded[index] = {
            key: shard_like(value, param)
            if (isinstance(param, DTensor) and isinstance(value, torch.Tensor)
                and not isinstance(value, DTensor) and value.shape == param.shape) else value
            for key, value in entry.items()}
    return {**state, 'state': sharded}
