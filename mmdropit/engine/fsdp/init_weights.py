"""Initialise a model's weights before it is sharded, and start every rank from rank 0's.

MMEngine's ``Runner`` calls ``init_weights()`` after wrapping; on a sharded model the
initialisers would see shards (wrong fan-in, per-shard random draws). The wrappers call
:func:`init_and_sync` first; ``BaseModule`` then skips the second call (``_is_init``).

Example::

    init_and_sync(model)   # every rank, before fully_shard / FullyShardedDataParallel
"""
from __future__ import annotations

import torch.distributed as dist
from torch import nn


def init_and_sync(module: nn.Module) -> None:
    """Run ``module.init_weights()`` unless done, then give every rank rank 0's parameters and
    buffers: once sharded, initialisers would see shards, and ranks must start equal."""
    if hasattr(module, 'init_weights') and not getattr(module, '_is_init', False):
        module.init_weights()
    for tensor in [*module.parameters(), *module.buffers()]:
        dist.broadcast(tensor.data, src=0)
