"""What one checkpoint costs besides its recomputation: the checkpoint machinery's host time.

A non-reentrant checkpoint packs and unpacks every saved tensor through hooks, saves and
restores the RNG state, and checks the recomputed tensors; this project's wrapper
(:mod:`.apply`) adds its marks and a copy of the arguments. On this project's CPU that is about
0.16 ms per checkpoint and step (forward and backward), next to segments that take milliseconds;
on a GPU, whose ops take microseconds, it can outweigh the recomputation, and a plan of many
small checkpoints costs more than its recomputed FLOPs say. :func:`checkpoint_seconds` measures
it once per device and process on a chain of tiny modules, and the cost model
(:func:`~.cost.chain_costs`) charges it to every checkpoint.

Example:
    >>> checkpoint_seconds(torch.device('cpu')) > 0
    True
"""
from __future__ import annotations

import functools

import torch
from torch import nn
from torch.utils._python_dispatch import _disable_current_modes

from ..common.timing import seconds_of
from .apply import checkpoint_module

_MODULES = 16  # tiny modules in the measured chain
_ROUNDS = 5  # timed steps of each chain after a warm-up one: the fastest counts


def _fastest_step(chain: nn.Module, x: torch.Tensor) -> float:
    return min(seconds_of(lambda: chain(x).sum().backward(), x.device)
               for _ in range(_ROUNDS + 1))


@functools.cache
def checkpoint_seconds(device: torch.device) -> float:
    """Host seconds one checkpoint adds to a training step on ``device`` (forward, backward and
    the machinery of its recomputation), measured once per device: a chain of tiny modules
    stepped plain and with each module checkpointed, the fastest of a few steps each (0.0 for
    a model on the meta device)."""
    if device.type == 'meta':
        return 0.0
    # outside any dispatch mode a caller runs (a memory meter would slow the steps it times)
    with _disable_current_modes(), torch.enable_grad(), \
            torch.random.fork_rng(devices=[device] if device.type == 'cuda' else []):
        torch.manual_seed(0)
        chain = nn.Sequential(*(nn.Linear(8, 8) for _ in range(_MODULES))).to(device)
        x = torch.randn(2, 8, device=device, requires_grad=True)
        plain = _fastest_step(chain, x)
        for module in chain:
            checkpoint_module(module)
        checkpointed = _fastest_step(chain, x)
    return max(checkpointed - plain, 0.0) / _MODULES
