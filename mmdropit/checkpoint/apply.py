"""Apply and remove checkpoints on modules, in place.

A checkpointed module keeps its Parameters, buffers and ``state_dict`` keys: its class is swapped
for a subclass whose ``forward`` runs the original one under
:func:`torch.utils.checkpoint.checkpoint` (non-reentrant: keyword arguments pass through, inputs
need not require grad, nested checkpoints and DDP work). A run of consecutive children of an
``nn.Sequential`` is checkpointed as one piece the same way, on the Sequential.

Lists and dicts among the arguments are copied (same tensors) when the checkpoint is entered, so
the recomputation sees them as they were even if the caller changes them later (DenseNet appends
to the feature list it passes to each layer). During the recomputation (which runs inside
backward) the BatchNorm layers of the recomputed part would update their running statistics a
second time; their buffers are saved before and restored after it, so the statistics are those
of one forward pass. The RNG state is restored before recomputing (``preserve_rng_state``), so
dropout drops the same elements. Eval mode and ``torch.no_grad`` run the plain forward.
Compressed modules inside a plain checkpoint (:func:`~mmdropit.codecs.compress_activations`)
store their codes when the region is recomputed, so for a region holding one the checkpoint does
not compare what its two passes saved (``determinism_check='none'``). A *selective* checkpoint
(:mod:`.selective`) keeps the outputs of its costly ops and recomputes only the rest. Under
``torch.compile`` the checkpoints become dynamo's checkpoint regions (the selective policy passes
as a module-level ``context_fn``, the only form dynamo takes), and the compiled backward does the
recomputation.

Example:
    >>> from torch import nn
    >>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(),
    ...                     nn.Linear(8, 2))
    >>> checkpoint_run(net, 0, 3)
    >>> net(torch.randn(2, 4)).sum().backward()
    >>> uncheckpoint(net); type(net).__name__
    'Sequential'
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils._pytree import tree_map
from torch.utils.checkpoint import checkpoint

from ..common.recompute_region import (COMPACT_WHEN_RECOMPUTED, checkpoint_pass,
                                       recomputed_region)
from ..common.training_state import values_restored
from .selective import selective_contexts

_CLASSES: dict[tuple[type, type], type] = {}


@contextlib.contextmanager
def _recomputing(module: nn.Module, inner: contextlib.AbstractContextManager) -> Iterator[None]:
    """Around a recomputation: ``inner`` (selective recompute's replay of kept outputs) inside
    a copy-and-restore of the BatchNorm buffers, which so run outside ``inner``'s op replay."""
    with values_restored(b for m in module.modules() if isinstance(m, _BatchNorm)
                         for b in m.buffers()), inner:
        yield


@contextlib.contextmanager
def _both(mark: contextlib.AbstractContextManager,
          inner: contextlib.AbstractContextManager) -> Iterator[None]:
    with mark, inner:
        yield


def _contexts(module: nn.Module, selective: bool) -> tuple:
    """The checkpoint's forward and recompute contexts. A plain checkpoint marks its first
    pass as one whose saved tensors are dropped (DropIT saves placeholders and selects in the
    recomputation); a selective one marks both passes as kept, since its recomputation replays
    the first pass's ops in order and must meet the same ones, even when it runs inside an outer
    checkpoint's first pass."""
    if not selective:
        return (checkpoint_pass(first=True),
                _both(checkpoint_pass(first=False, recomputation=True),
                      _recomputing(module, contextlib.nullcontext())))
    forward, recompute = selective_contexts()
    return (_both(checkpoint_pass(first=False), forward),
            _both(checkpoint_pass(first=False), _recomputing(module, recompute)))


def _checkpointed(module: nn.Module, run: Callable, selective: bool, *args, **kwargs):
    # New lists / dicts around the same tensors: the recomputation must see the arguments as
    # they were, even when the caller appends to a list it passed (DenseNet's feature list).
    args, kwargs = tree_map(lambda leaf: leaf, (args, kwargs))
    if torch.compiler.is_compiling():
        # dynamo takes a context_fn only as a module-level function (the selective policy);
        # the compiled backward recomputes without running BatchNorm's buffer updates again
        policy = {'context_fn': selective_contexts} if selective else {}
        return checkpoint(run, *args, use_reentrant=False, **policy, **kwargs)
    # a compressed module stores codes when recomputed where the first pass saved dense
    # tensors: the two passes' saved tensors then differ by design, and are not compared
    compact = any(getattr(m, COMPACT_WHEN_RECOMPUTED, False) for m in module.modules())
    return checkpoint(_marked(run), *args, use_reentrant=False,
                      context_fn=lambda: _contexts(module, selective),
                      determinism_check='none' if compact and not selective else 'default',
                      **kwargs)


def _marked(run: Callable) -> Callable:
    """``run`` inside :func:`~mmdropit.common.recompute_region.recomputed_region` (in the first
    forward pass and in the recomputation alike)."""
    def marked(*args, **kwargs):
        with recomputed_region():
            return run(*args, **kwargs)
    return marked


def _active(module: nn.Module) -> bool:
    return module.training and torch.is_grad_enabled()


class _CheckpointedModule:
    """Mixin: the whole forward of the module is one checkpoint (``_mmdropit_selective``: a
    selective one)."""

    _mmdropit_selective: bool

    def forward(self, *args, **kwargs):
        forward = super().forward
        if not _active(self):
            return forward(*args, **kwargs)
        return _checkpointed(self, forward, self._mmdropit_selective, *args, **kwargs)


class _CheckpointedRuns:
    """Mixin for ``nn.Sequential``: runs of children (``_mmdropit_runs``: first, last, whether
    selective) are checkpoints."""

    _mmdropit_runs: list[tuple[int, int, bool]]

    def forward(self, x):
        children = list(self)
        if not _active(self):
            for child in children:
                x = child(x)
            return x
        starts = {first: (last, selective) for first, last, selective in self._mmdropit_runs}
        i = 0
        while i < len(children):
            if i not in starts:
                x = children[i](x)
                i += 1
                continue
            last, selective = starts[i]
            part = nn.Sequential(*children[i:last + 1])
            x = _checkpointed(part, part.forward, selective, x)
            i = last + 1
        return x


def _swap(module: nn.Module, mixin: type) -> None:
    base = getattr(module, '_mmdropit_checkpoint_base', type(module))
    key = (mixin, base)
    if key not in _CLASSES:
        _CLASSES[key] = type(f'Checkpointed{base.__name__}', (mixin, base),
                             {'__module__': base.__module__})
    module._mmdropit_checkpoint_base = base
    module.__class__ = _CLASSES[key]


def checkpoint_module(module: nn.Module, selective: bool = False) -> None:
    """Make every call of ``module`` one non-reentrant checkpoint (``selective``: keeping the
    outputs of its costly ops)."""
    _swap(module, _CheckpointedModule)
    module._mmdropit_selective = selective


def checkpoint_run(sequential: nn.Sequential, first: int, last: int,
                   selective: bool = False) -> None:
    """Checkpoint children ``first..last`` (inclusive) of ``sequential`` as one piece
    (``selective``: keeping the outputs of its costly ops)."""
    if not isinstance(sequential, nn.Sequential):
        raise TypeError(f'a run checkpoint needs an nn.Sequential, got {type(sequential).__name__}')
    runs = list(getattr(sequential, '_mmdropit_runs', []))
    runs.append((first, last, selective))
    _swap(sequential, _CheckpointedRuns)
    sequential._mmdropit_runs = sorted(runs)


def is_checkpointed(module: nn.Module) -> bool:
    """Whether :func:`checkpoint_module` or :func:`checkpoint_run` was applied to ``module``."""
    return hasattr(module, '_mmdropit_checkpoint_base')


def uncheckpoint(module: nn.Module) -> None:
    """Undo :func:`checkpoint_module` / :func:`checkpoint_run` on ``module`` (no-op otherwise)."""
    base = module.__dict__.pop('_mmdropit_checkpoint_base', None)
    if base is not None:
        module.__class__ = base
        module.__dict__.pop('_mmdropit_runs', None)
        module.__dict__.pop('_mmdropit_selective', None)
