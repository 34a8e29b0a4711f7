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
a selective segment is charged it for every op its region runs. A checkpoint nested in another
(:mod:`.nested`) runs its machinery once more, inside the outer one's recomputation:
:func:`nesting_seconds` measures that, and each inner checkpoint of a nested plan is charged it.

Example:
    >>> checkpoint_seconds(torch.device('cpu')) > 0
    True
    >>> selective_seconds_per_op(torch.device('cpu')) >= 0
    True
    >>> nesting_seconds(torch.device('cpu')) >= 0
    True
"""
from __future__ import annotations

import functools
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes

from ..common.timing import seconds_of
from .apply import checkpoint_module

_PAIRS = 8  # pairs of tiny modules in the measured chain: each pair an outer checkpoint
_MODULES = 2 * _PAIRS  # tiny modules, each an inner checkpoint
_ROUNDS = 5  # timed steps of each chain after a warm-up one: the fastest counts


@dataclass(frozen=True)
class _Overheads:
    """Host seconds a training step pays: per checkpoint, per ATen op of a selective region,
    per inner checkpoint of a nested one."""

    checkpoint: float = 0.0
    selective_per_op: float = 0.0
    nesting: float = 0.0


def _fastest_step(chain: nn.Module, x: torch.Tensor) -> float:
    """The fastest of a few timed training steps of ``chain`` on ``x`` (after a warm-up)."""
    return min(seconds_of(lambda: chain(x).sum().backward(), x.device)
               for _ in range(_ROUNDS + 1))


def _tiny_chain(device: torch.device) -> tuple[nn.Sequential, torch.Tensor]:
    """:data:`_PAIRS` pairs of tiny Linear + GELU modules, and an input."""
    torch.manual_seed(0)
    chain = nn.Sequential(*(nn.Sequential(*(nn.Sequential(nn.Linear(8, 8), nn.GELU())
                                            for _ in range(2)))
                            for _ in range(_PAIRS))).to(device)
    return chain, torch.randn(2, 8, device=device, requires_grad=True)


@functools.cache
def _overheads(device: torch.device) -> _Overheads:
    """What :func:`checkpoint_seconds`, :func:`selective_seconds_per_op` and
    :func:`nesting_seconds` return, measured together once per device: a chain of tiny modules
    stepped plain, with each module checkpointed, with each checkpoint selective, and with
    each pair of module checkpoints nested in one of its own (the fastest of a few steps
    each), outside any dispatch mode a caller runs (a memory meter would slow the steps it
    times), with the RNG state kept; nothing on the meta device."""
    if device.type == 'meta':
        return _Overheads()
    with _disable_current_modes(), torch.enable_grad(), \
            torch.random.fork_rng(devices=[device] if device.type == 'cuda' else []):
        chain, x = _tiny_chain(device)
        modules = [module for pair in chain for module in pair]
        with _OpCounter() as counter:
            chain(x)
        plain = _fastest_step(chain, x)
        for module in modules:
            checkpoint_module(module)
        checkpointed = _fastest_step(chain, x)
        for module in modules:
            module._mmdropit_selective = True
        selective = _fastest_step(chain, x)
        for module in modules:
            module._mmdropit_selective = False
        for pair in chain:
            checkpoint_module(pair)
        nested = _fastest_step(chain, x)
    checkpoint = max(checkpointed - plain, 0.0) / _MODULES
    return _Overheads(checkpoint, max(selective - checkpointed, 0.0) / max(counter.ops, 1),
                      max(nested - checkpointed - _PAIRS * checkpoint, 0.0) / _MODULES)


def checkpoint_seconds(device: torch.device) -> float:
    """Host seconds one checkpoint adds to a training step on ``device`` (forward, backward and
    the machinery of its recomputation), measured once per device: a chain of tiny modules
    stepped plain and with each module checkpointed."""
    return _overheads(device).checkpoint


def selective_seconds_per_op(device: torch.device) -> float:
    """Host seconds a selective checkpoint adds to a training step on ``device`` for each ATen
    op its region runs (its dispatch mode, in the forward pass and the recomputation), measured
    once per device: the chain of tiny modules each checkpointed, plainly and selectively."""
    return _overheads(device).selective_per_op


def nesting_seconds(device: torch.device) -> float:
    """Host seconds a checkpoint nested in another adds to a training step on ``device``
    beyond its own :func:`checkpoint_seconds`: its machinery runs again in the outer
    checkpoint's recomputation. Measured once per device: the chain of tiny modules each
    checkpointed, then each pair of them checkpointed around them."""
    return _overheads(device).nesting


class _OpCounter(TorchDispatchMode):
    """Counts the ATen ops run inside it."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.ops += 1
        return func(*args, **(kwargs or {}))
