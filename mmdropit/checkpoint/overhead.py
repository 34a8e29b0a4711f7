"""What one checkpoint costs besides its recomputation: the checkpoint machinery's host time, and
what a selective checkpoint's dispatch mode adds to every ATen op it runs.

A non-reentrant checkpoint packs and unpacks every saved tensor through hooks, saves and
restores the RNG state, and checks the recomputed tensors; this project's wrapper
(:mod:`.apply`) adds its marks and a copy of the arguments. On this project's CPU that is about
0.16 ms per checkpoint and step (forward and backward), next to segments that take milliseconds;
on a GPU, whose ops take microseconds, it can outweigh the recomputation, and a plan of many
small checkpoints costs more than its recomputed FLOPs say. :func:`checkpoint_seconds` measures
it once per device and process on a chain of tiny modules, and the cost model
(:func:`~.cost.chain_costs`) charges it to every checkpoint. A selective checkpoint
(:mod:`.selective`) also runs a Python dispatch mode around every ATen op of its region, in the
forward pass and the recomputation: :func:`selective_seconds_per_op` measures that per op, and
a selective segment is charged it for every op its region runs.

Example:
    >>> checkpoint_seconds(torch.device('cpu')) > 0
    True
    >>> selective_seconds_per_op(torch.device('cpu')) >= 0
    True
"""
from __future__ import annotations

import functools

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from ..common.timing import seconds_of
from .apply import checkpoint_module

_MODULES = 16  # tiny modules in the measured chain
_ROUNDS = 5  # timed steps of each chain after a warm-up one: the fastest counts


def _fastest_step(chain: nn.Module, x: torch.Tensor) -> float:
    """The fastest of a few timed training steps of ``chain`` on ``x`` (after a warm-up)."""
    return min(seconds_of(lambda: chain(x).sum().backward(), x.device)
               for _ in range(_ROUNDS + 1))


def _tiny_chain(device: torch.device) -> tuple[nn.Sequential, torch.Tensor]:
    torch.manual_seed(0)
    chain = nn.Sequential(*(nn.Sequential(nn.Linear(8, 8), nn.GELU())
                            for _ in range(_MODULES))).to(device)
    return chain, torch.randn(2, 8, device=device, requires_grad=True)


@functools.cache
def _overheads(device: torch.device) -> tuple[float, float]:
    """What :func:`checkpoint_seconds` and :func:`selective_seconds_per_op` return, measured
    together once per device: the chain of tiny modules stepped plain, with each module
    checkpointed, and with each checkpoint selective (the fastest of a few steps each), outside
    any dispatch mode a caller runs (a memory meter would slow the steps it times), with the RNG
    state kept; ``(0.0, 0.0)`` on the meta device."""
    if device.type == 'meta':
        return 0.0, 0.0
    with _disable_current_modes(), torch.enable_grad(), \
            torch.random.fork_rng(devices=[device] if device.type == 'cuda' else []):
        chain, x = _tiny_chain(device)
        with _OpCounter() as counter:
            chain(x)
        plain = _fastest_step(chain, x)
        for module in chain:
            checkpoint_module(module)
        checkpointed = _fastest_step(chain, x)
        for module in chain:
            module._mmdropit_selective = True
        selective = _fastest_step(chain, x)
    return (max(checkpointed - plain, 0.0) / _MODULES,
            max(selective - checkpointed, 0.0) / max(counter.ops, 1))


def checkpoint_seconds(device: torch.device) -> float:
    """Host seconds one checkpoint adds to a training step on ``device`` (forward, backward and
    the machinery of its recomputation), measured once per device: a chain of tiny modules
    stepped plain and with each module checkpointed."""
    return _overheads(device)[0]


def selective_seconds_per_op(device: torch.device) -> float:
    """Host seconds a selective checkpoint adds to a training step on ``device`` for each ATen
    op its region runs (its dispatch mode, in the forward pass and the recomputation), measured
    once per device: the chain of tiny modules each checkpointed, plainly and selectively."""
    return _overheads(device)[1]


class _OpCounter(TorchDispatchMode):
    """Counts the ATen ops run inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))
