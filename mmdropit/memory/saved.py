"""Saved-activation bytes: what autograd keeps from the forward pass for the backward pass.

Every tensor that autograd saves for backward passes through
:class:`torch.autograd.graph.saved_tensors_hooks`. The meter counts each underlying storage once
(views and repeated saves of one tensor share a storage), leaves out the parameters and buffers of
the model (they live anyway), and changes nothing for autograd: the pack hook returns a detached
alias of the tensor it was given (the same storage, no copy), as PyTorch advises so that a saved
output does not hold itself alive through a reference cycle.
"""
from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

import torch
from torch import nn
from ..common.parameters import local_part
from ..common.saved_tensors import observing_saves, watching_kept
from .meter import Meter

T = TypeVar('T')

_StorageKey = tuple[str, int]


@dataclass(frozen=True)
class SavedActivations:
    """Bytes autograd kept for backward during one measured region.

    Attributes:
        total_bytes: Bytes of the distinct storages saved for backward.
        num_tensors: Number of distinct storages (not of ``save_for_backward`` calls).
        by_dtype: Bytes per dtype name, e.g. ``{'float32': 6144}``.

    Example:
        >>> saved = SavedActivations(total_bytes=6144, num_tensors=2, by_dtype={'float32': 6144})
        >>> saved.by_dtype['float32'] / saved.total_bytes
        1.0
    """

    total_bytes: int = 0
    num_tensors: int = 0
    by_dtype: dict[str, int] = field(default_factory=dict)


def _storage_key(storage: torch.UntypedStorage) -> _StorageKey:
    return str(storage.device), storage.data_ptr()


def _storages_of(model: nn.Module | None) -> set[_StorageKey]:
    if model is None:
        return set()
    tensors = [local_part(t) for t in (*model.parameters(), *model.buffers())]
    return {_storage_key(t.untyped_storage()) for t in tensors if t.device.type != 'meta'}


class SavedTensorMeter(Meter[SavedActivations]):
    """Count the bytes that autograd saves for backward, each storage once.

    Use it as a context manager around a training step, or call :meth:`start` and :meth:`stop`
    from two places (e.g. the ``before_train_iter`` and ``after_train_iter`` of a hook).

    What is counted: every tensor packed by autograd during a forward pass while the meter runs,
    including the inputs that ``torch.utils.checkpoint`` keeps and the compact tensors that custom
    autograd Functions store with ``ctx.save_for_backward``. What is not: tensors packed during a
    backward pass (the recomputation of reentrant checkpointing, double backward: short-lived
    backward memory, which the peak meter sees), parameters and buffers of ``model`` (compared by
    storage), tensors on the ``meta`` device, storages of zero bytes, and tensors without a
    storage of their own (sparse tensors, wrapper subclasses). Modules whose own saved-tensor
    hooks store tensors in another form (compressed activations) report what they keep through
    :mod:`mmdropit.common.saved_tensors`, and it is counted the same way.

    A saved view counts its whole storage, since it keeps all of it alive. A storage that is freed
    while the meter runs and whose address is then reused by a new storage
    is counted as two storages: the meter follows each storage with a weak reference, so it never
    keeps memory alive and never changes the peak it runs in.

    Args:
        model: The model whose parameters and buffers are left out; ``None`` leaves out nothing.

    Example:
        >>> net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32))
        >>> with SavedTensorMeter(net) as meter:
        ...     net(torch.randn(8, 64)).sum().backward()
        >>> meter.result.total_bytes  # input of the first Linear + output of the ReLU
        6144
    """

    def __init__(self, model: nn.Module | None = None) -> None:
        super().__init__()
        self.model = model
        self._hooks: contextlib.AbstractContextManager | None = None
        self._watching: contextlib.AbstractContextManager | None = None
        self._excluded: set[_StorageKey] = set()
        self._alive: dict[_StorageKey, weakref.ref] = {}
        self._bytes_by_dtype: dict[str, int] = {}
        self._num_storages = 0

    @property
    def running(self) -> bool:
        """Whether the meter is between :meth:`start` and :meth:`stop`."""
        return self._hooks is not None

    def _start(self) -> None:
        self._excluded = _storages_of(self.model)
        self._alive = {}
        self._bytes_by_dtype = {}
        self._num_storages = 0
        self._hooks = observing_saves(self._pack)
        self._hooks.__enter__()
        self._watching = watching_kept(self._pack)  # what inner saved-tensor hooks keep
        self._watching.__enter__()

    def _stop(self) -> SavedActivations:
        self._watching.__exit__(None, None, None)
        self._hooks.__exit__(None, None, None)
        self._hooks = self._watching = None
        self._alive = {}
        return SavedActivations(
            total_bytes=sum(self._bytes_by_dtype.values()),
            num_tensors=self._num_storages,
            by_dtype=dict(self._bytes_by_dtype))

    def _pack(self, tensor: torch.Tensor) -> torch.Tensor:
        if torch._C._current_graph_task_id() == -1:  # -1: not inside a backward pass
            self._record(tensor)
        return tensor.detach()

    def _record(self, tensor: torch.Tensor) -> None:
        if tensor.device.type == 'meta' or tensor.is_sparse:
            return
        try:
            storage = tensor.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return  # a tensor without a storage of its own
        nbytes = storage.nbytes()
        key = _storage_key(storage)
        if nbytes == 0 or key in self._excluded or key in self._alive:
            return
        alive = self._alive
        self._alive[key] = weakref.ref(storage, lambda _ref: alive.pop(key, None))
        dtype = str(tensor.dtype).removeprefix('torch.')
        self._bytes_by_dtype[dtype] = self._bytes_by_dtype.get(dtype, 0) + nbytes
        self._num_storages += 1


def measure_saved_activations(forward: Callable[[], T],
                              model: nn.Module | None = None) -> tuple[T, SavedActivations]:
    """Run ``forward`` under a :class:`SavedTensorMeter` and return its output and the count.

    Only the forward pass needs to run inside: that is where autograd saves tensors.

    Args:
        forward: Runs the forward pass and returns its output (e.g. the loss).
        model: The model whose parameters and buffers are left out of the count.

    Returns:
        ``(output of forward, SavedActivations)``.

    Example:
        >>> net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32))
        >>> loss, saved = measure_saved_activations(lambda: net(torch.randn(8, 64)).sum(), net)
        >>> saved.num_tensors, saved.by_dtype
        (2, {'float32': 6144})
    """
    with SavedTensorMeter(model) as meter:
        output = forward()
    return output, meter.result
