"""Record one real forward pass of a training step: module calls, saved bytes, time, hazards.

The user's ``step()`` runs once to warm up and once recorded, eagerly, as in training (so
data-dependent Python, dict inputs, data samples and several outputs all work; nothing is
traced). While the recorded pass runs:

- module forward hooks follow which module of the model is executing, giving a tree of
  :class:`~.step_record.ModuleCall` records with their inclusive forward time and the storages
  of their tensor inputs and outputs;
- :class:`torch.autograd.graph.saved_tensors_hooks` see every tensor autograd keeps for backward
  (DropIT's compact tensors included) and file its storage under the innermost running call,
  in order with that call's child calls;
- each call's input tensors are remembered with their version counter: an input changed in place
  after the call started (an in-place op of the call itself or of a later one) makes the call
  unsafe to recompute, so no checkpoint may start there;
- a dispatch mode times each costly ATen op (:data:`.selective.COSTLY_OPS`: matrix products,
  convolutions, fused attention) and files its outputs under the innermost running call, for
  selective checkpoints; an output changed in place later is marked, as it could not be reused;
- the same mode numbers every ATen op and notes, for each module call's outputs, which calls'
  own code read them and when (any op taking them as an input), so a plan knows where an output
  goes (:mod:`.chain`'s sibling runs).

Afterwards the buffers (BatchNorm statistics) and the RNG state are restored, so recording changes
no training state. The loss is not back-propagated.

The hooks and the dispatch mode cost host time on every ATen op. On a CPU that is a few percent
of ops that take milliseconds; on a GPU, whose ops take microseconds to launch, it can inflate
the recorded times several-fold (measured in docs/benchmarks.md). When the recorded
pass is clearly slower than the warm-up pass before it (by :data:`NOISE` or more), the
difference, spread evenly over the ops run, is taken off each call and costly op by the number
of ops it ran (:attr:`~.step_record.StepRecord.recording_seconds_per_op`).

Example:
    >>> from torch import nn
    >>> net = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
    >>> x = torch.randn(8, 16)
    >>> record = record_step(net, lambda: net(x).sum())
    >>> [call.name for call in record.calls]  # the whole step, then each module call
    ['<step>', '', '0', '1', '2']
    >>> record.calls[2].saved_bytes  # the first Linear saves the batch, held before the step
    0
    >>> record.calls[3].saved_bytes  # the GELU saves its input, 8 x 32 floats
    1024
"""
from __future__ import annotations

import time
import weakref
from collections.abc import Callable, Iterator

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

from ..common.backward_workspace import observe_workspace
from ..common.host_copies import MIN_BYTES
from ..common.parameters import local_part, model_device
from ..common.recompute_region import recomputed_region
from ..common.training_state import preserved_training_state
from .overhead import checkpoint_seconds, nesting_seconds, selective_seconds_per_op
from .selective import is_costly
from .step_record import STEP, CostlyOp, ModuleCall, StepRecord

NOISE = 0.1
"""Share by which the recorded pass must exceed the warm-up pass before the recorder's own time
is taken off (below it, the difference is noise: nothing is taken off)."""


class _Recorder:
    def __init__(self, model: nn.Module) -> None:
        self.names = {id(module): name for name, module in model.named_modules()}
        self.excluded = {local_part(t).untyped_storage().data_ptr()
                         for t in (*model.parameters(), *model.buffers())}
        self.calls = [ModuleCall(0, STEP, type(model).__name__, None, needs_grad=True)]
        self.stack: list[int] = [0]
        self.started: dict[int, float] = {}
        self.storage_bytes: dict[int, int] = {}
        self.saver: dict[int, int] = {}
        self.alive: dict[tuple[str, int], tuple[int, weakref.ref]] = {}
        self.versions: list[tuple[int, torch.Tensor, int]] = []
        self.ops: list[CostlyOp] = []
        self.op_versions: list[tuple[int, torch.Tensor, int]] = []
        self.times_called: dict[str, int] = {}
        self.readers: dict[int, list[tuple[int, int]]] = {}
        self.made: set[tuple[str, int]] = set()  # storages the step's ops allocated
        self.external: set[int] = set()  # ids of storages that existed before the step
        self.ops_run = 0
        self.device = model_device(model)
        self.sync = self.device.type == 'cuda'

    def storage_id(self, tensor: torch.Tensor) -> int | None:
        keyed = _keyed_storage(tensor)
        if keyed is None:
            return None
        key, storage = keyed
        if storage.nbytes() == 0 or storage.data_ptr() in self.excluded:
            return None
        entry = self.alive.get(key)
        if entry is not None and entry[1]() is storage:
            return entry[0]
        sid = len(self.storage_bytes)
        if key not in self.made:
            self.external.add(sid)
        alive = self.alive
        self.alive[key] = (sid, weakref.ref(storage, lambda _ref: alive.pop(key, None)))
        self.storage_bytes[sid] = storage.nbytes()
        return sid

    def tensor_ids(self, values: object) -> tuple[list[torch.Tensor], tuple[int, ...],
                                                  tuple[int, ...]]:
        """The tensors among ``values``, their distinct storage ids, and those of the tensors
        that require grad."""
        tensors = [v for v in tree_flatten(values)[0] if isinstance(v, torch.Tensor)]
        ids = [self.storage_id(t) for t in tensors]
        grad_ids = (i for t, i in zip(tensors, ids) if t.requires_grad and i is not None)
        return (tensors, tuple(dict.fromkeys(i for i in ids if i is not None)),
                tuple(dict.fromkeys(grad_ids)))

    def now(self) -> float:
        if self.sync:
            torch.cuda.synchronize()
        return time.perf_counter()

    def pre_hook(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        name = self.names.get(id(module))
        if name is None:
            return
        index = len(self.calls)
        parent = self.stack[-1]
        tensors, inputs, grad_inputs = self.tensor_ids((args, kwargs))
        needs_grad = bool(grad_inputs) or any(p.requires_grad for p in module.parameters())
        movable = (self.storage_id(t) for t in args if isinstance(t, torch.Tensor)
                   and t.grad_fn is not None and t.nbytes >= MIN_BYTES)
        self.calls.append(ModuleCall(
            index, name, type(module).__name__, parent, inputs=inputs, grad_inputs=grad_inputs,
            movable_inputs=tuple(dict.fromkeys(i for i in movable if i is not None)),
            needs_grad=needs_grad, started_at=self.ops_run,
            argument=id(args[0]) if len(args) == 1 and not kwargs and isinstance(
                args[0], torch.Tensor) else None))
        self.calls[parent].events.append(('call', index))
        self.versions.extend((index, t, t._version) for t in tensors)
        self.times_called[name] = self.times_called.get(name, 0) + 1
        self.stack.append(index)
        self.started[index] = self.now()

    def post_hook(self, module: nn.Module, args: tuple, kwargs: dict, output: object) -> None:
        if id(module) not in self.names or len(self.stack) < 2:
            return
        index = self.stack.pop()
        call = self.calls[index]
        call.seconds = self.now() - self.started.pop(index)
        call.outputs = self.tensor_ids(output)[1]
        call.result = id(output) if isinstance(output, torch.Tensor) else None
        call.ended_at = self.ops_run
        for sid in call.outputs:
            self.readers.setdefault(sid, [])

    def read(self, args: object) -> set[tuple[str, int]]:
        """Note the running call as a reader of the module outputs among ``args``, the
        arguments of the next ATen op; return the keys of their storages."""
        self.ops_run += 1
        keys = set()
        for key, storage in _storages(args):
            keys.add(key)
            entry = self.alive.get(key)
            if entry is not None and entry[0] in self.readers and entry[1]() is storage:
                self.readers[entry[0]].append((self.stack[-1], self.ops_run))
        return keys

    def allocated(self, output: object, read: set[tuple[str, int]]) -> None:
        """Note the storages of an op's ``output`` that are none of those it ``read``: the
        step made them."""
        self.made.update(key for key, _ in _storages(output) if key not in read)

    def pack(self, tensor: torch.Tensor) -> torch.Tensor:
        if torch._C._current_graph_task_id() == -1 and not tensor.is_sparse \
                and tensor.device.type != 'meta':
            sid = self.storage_id(tensor)
            call = self.calls[self.stack[-1]]
            if sid is not None:
                call.events.append(('save', sid))
                self.saver.setdefault(sid, call.index)
        return tensor.detach()

    def workspace(self, nbytes: int) -> None:
        call = self.calls[self.stack[-1]]
        call.backward_workspace = max(call.backward_workspace, nbytes)

    def costly_op(self, output: object, seconds: float) -> None:
        index = len(self.ops)
        tensors, outputs, _ = self.tensor_ids(output)
        call = self.stack[-1]
        self.ops.append(CostlyOp(call, outputs, seconds))
        self.calls[call].events.append(('op', index))
        self.op_versions.extend((index, t, t._version) for t in tensors)

    def take_off_own_time(self, unrecorded_seconds: float | None) -> float:
        """Take the recorder's own time off the calls and costly ops when the recorded pass
        (``calls[0].seconds``) exceeds ``unrecorded_seconds`` by :data:`NOISE` or more; return
        the seconds taken off per ATen op."""
        recorded = self.calls[0].seconds
        if (unrecorded_seconds is None or not self.ops_run
                or recorded < (1 + NOISE) * unrecorded_seconds):
            return 0.0
        per_op = (recorded - unrecorded_seconds) / self.ops_run
        for call in self.calls[1:]:
            call.seconds = max(call.seconds - per_op * (call.ended_at - call.started_at), 0.0)
        for op in self.ops:
            op.seconds = max(op.seconds - per_op, 0.0)
        self.calls[0].seconds = unrecorded_seconds
        return per_op

    def finish(self, model: nn.Module, per_op: float) -> StepRecord:
        for index, tensor, version in self.versions:
            if tensor._version != version:
                self.calls[index].inplace_hazard = True
        for index, tensor, version in self.op_versions:
            if tensor._version != version:
                self.ops[index].changed_in_place = True
        self.versions.clear()
        self.op_versions.clear()
        for sid in self.external:
            self.storage_bytes[sid] = 0
        record = StepRecord(self.calls, self.storage_bytes, self.saver,
                            _param_grad_bytes(model), self.times_called, self.ops, self.readers,
                            per_op, checkpoint_seconds(self.device),
                            selective_seconds_per_op(self.device),
                            nesting_seconds(self.device))
        for call in reversed(self.calls):
            call.saved_bytes = sum(self.storage_bytes[sid] for sid in record.saves_in(call.index))
        return record


class _OpWatcher(TorchDispatchMode):
    """Times the costly ATen ops and hands them to the recorder, and tells it which module
    outputs each op reads and which storages each op allocates."""

    def __init__(self, recorder: _Recorder) -> None:
        super().__init__()
        self.recorder = recorder

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        read = self.recorder.read((args, kwargs))
        costly = is_costly(func)
        started = self.recorder.now() if costly else 0.0
        output = func(*args, **kwargs)
        if costly:
            seconds = self.recorder.now() - started
        self.recorder.allocated(output, read)  # before the output gets a storage id
        if costly:
            self.recorder.costly_op(output, seconds)
        return output


def _keyed_storage(value: object) -> tuple[tuple[str, int], torch.UntypedStorage] | None:
    """``((device, data pointer), storage)`` of a tensor that is not a parameter (nor FSDP2's
    unsharded parameter in forward), else ``None``."""
    if not isinstance(value, torch.Tensor) or isinstance(value, nn.Parameter):
        return None
    try:
        storage = value.untyped_storage()
    except (RuntimeError, NotImplementedError):
        return None
    return (str(storage.device), storage.data_ptr()), storage


def _storages(values: object) -> Iterator[tuple[tuple[str, int], torch.UntypedStorage]]:
    """``((device, data pointer), storage)`` of each tensor among ``values`` but parameters."""
    for leaf in tree_flatten(values)[0]:
        keyed = _keyed_storage(leaf)
        if keyed is not None:
            yield keyed


def _param_grad_bytes(model: nn.Module) -> dict[str, int]:
    return {name: sum(p.numel() * p.element_size()
                      for p in module.parameters(recurse=False) if p.requires_grad)
            for name, module in model.named_modules()}


def record_step(model: nn.Module, step: Callable[[], object], warmup: bool = True) -> StepRecord:
    """Run ``step()`` (a forward pass of ``model`` returning the loss) and record it.

    Args:
        model: The model whose module calls become the units of a plan (unwrapped).
        step: Runs the forward pass as in training, e.g. ``lambda: model(x, mode='loss')``.
        warmup: Run ``step()`` once more first (twice on a GPU), unrecorded, so the recorded
            times are those of a warm forward pass (lazy initialisation and first allocations
            are left out); its time tells the recorder's own (see the module doc).

    Returns:
        A :class:`~.step_record.StepRecord`; training state (buffers, RNG) is as it was before
        the call.

    The step is recorded as inside a checkpoint's region
    (:func:`~mmdropit.common.recompute_region.recomputed_region`): modules whose saved tensors
    are compressed (:func:`~mmdropit.codecs.compress_activations`) step aside there, so the
    record holds the dense tensors a recomputed segment really holds, and a plan's predicted
    peak is an upper bound where segments stay compressed.
    """
    recorder = _Recorder(model)
    warm_passes = []
    with preserved_training_state(model), torch.enable_grad(), recomputed_region():
        for _ in range(warmup * (2 if recorder.sync else 1)):  # a GPU's first pass may be cold
            started = recorder.now()
            step()
            warm_passes.append(recorder.now() - started)
        handles = [
            module.register_forward_pre_hook(recorder.pre_hook, with_kwargs=True)
            for module in model.modules()
        ] + [
            module.register_forward_hook(recorder.post_hook, with_kwargs=True, always_call=True)
            for module in model.modules()
        ]
        try:
            with torch.autograd.graph.saved_tensors_hooks(recorder.pack, lambda t: t), \
                    observe_workspace(recorder.workspace), _OpWatcher(recorder):
                started = recorder.now()
                step()
                recorder.calls[0].seconds = recorder.now() - started
        finally:
            for handle in handles:
                handle.remove()
    return recorder.finish(model, recorder.take_off_own_time(min(warm_passes, default=None)))
