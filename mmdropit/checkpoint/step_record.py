"""What :func:`~.record.record_step` saw of one forward pass: the module calls in call order,
each with its saved storages, inputs, outputs and time; the costly ops; the bytes of every
storage (:class:`StepRecord`). The chain, the cost model and the solvers read it.
"""
from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

STEP = '<step>'
"""Name of the call that stands for the whole recorded step (its children are the top-level
module calls)."""

Event = tuple[str, int]
"""An entry of a call's timeline: ``('call', call_index)``, ``('save', storage_id)`` or
``('op', op_index)`` (a costly op run by the call's own code)."""


@dataclass
class CostlyOp:
    """One run of a costly ATen op (its outputs are what a selective checkpoint keeps).

    Attributes:
        call: Index of the innermost module call running it.
        outputs: Storage ids of its tensor outputs.
        seconds: Its wall time (the recorder's own time taken off, see the module doc).
        changed_in_place: An output was modified in place later in the forward pass.
    """

    call: int
    outputs: tuple[int, ...]
    seconds: float
    changed_in_place: bool = False


@dataclass
class ModuleCall:
    """One call of one module of the model during the recorded forward pass.

    Attributes:
        index: Position in call order (the root call is 0).
        name: Qualified module name (``''`` for the model itself).
        module_type: The module's class name.
        parent: Index of the enclosing call (``None`` for the root).
        events: In order: child calls, and the storages saved and costly ops run directly by
            this call's own code.
        inputs: Storage ids of the tensor arguments.
        grad_inputs: Those of them that require grad (backward makes a gradient of each).
        movable_inputs: Those of the positional tensor arguments that autograd made (with a
            ``grad_fn``) of at least :data:`~mmdropit.common.host_copies.MIN_BYTES`: what a
            checkpoint of the call moves to host memory when it keeps its inputs there
            (:mod:`.apply`; keyword arguments, tensors in containers and smaller ones stay).
        outputs: Storage ids of the tensors returned.
        seconds: Inclusive forward wall time (the recorder's own time taken off, see the module
            doc).
        inplace_hazard: An input was modified in place after the call started.
        needs_grad: Some input or parameter of the call requires grad.
        argument: ``id()`` of the tensor the call took, when it took one tensor and nothing
            else; ``None`` otherwise.
        result: ``id()`` of the tensor the call returned, when it returned a tensor (these two
            say whether calls pass one tensor on in a run of siblings, :mod:`.chain`; the
            tensors are alive from one call to the next, so their ids do not repeat there).
        started_at: Number of ATen ops run when the call started.
        ended_at: Number of ATen ops run when the call returned (see ``StepRecord.readers``).
    """

    index: int
    name: str
    module_type: str
    parent: int | None
    events: list[Event] = field(default_factory=list)
    inputs: tuple[int, ...] = ()
    grad_inputs: tuple[int, ...] = ()
    movable_inputs: tuple[int, ...] = ()
    outputs: tuple[int, ...] = ()
    seconds: float = 0.0
    inplace_hazard: bool = False
    needs_grad: bool = False
    argument: int | None = None
    result: int | None = None
    started_at: int = 0
    ended_at: int = 0
    saved_bytes: int = 0
    """Bytes of the distinct storages saved inside the call (children included)."""
    backward_workspace: int = 0
    """Largest allocation the call's own code announced for its backward pass
    (:mod:`~mmdropit.common.backward_workspace`: a DropIT layer's rebuilt input)."""


@dataclass
class StepRecord:
    """What :func:`record_step` saw.

    Attributes:
        calls: ``calls[0]`` stands for the whole step (named :data:`STEP`); then every module
            call in call order (the model's own call, and e.g. its data preprocessor's).
        storage_bytes: Bytes of each storage id seen (saved, input or output); 0 for a storage
            that existed before the step (the input batch: its caller holds it whatever the
            plan, and memory meters do not count it as an activation).
        saver: For each saved storage id, the index of the first call that saved it.
        param_grad_bytes: Bytes of the gradients of each module's own parameters, by name.
        times_called: How often each module name was called.
        ops: The costly ops run, in order (``('op', index)`` events point here).
        readers: For each storage a module call returned, the ATen ops reading it, as
            ``(call, op number)``: the innermost call running, and how many ops ran before.
        recording_seconds_per_op: The recorder's own time per ATen op taken off the recorded
            times (0.0 where the recorded pass was within :data:`~.record.NOISE` of the warm-up's).
        checkpoint_seconds: What one checkpoint's machinery costs a step on the model's device
            (:func:`~.overhead.checkpoint_seconds`), charged to every checkpoint of a plan.
        selective_seconds_per_op: What a selective checkpoint costs a step per ATen op of its
            region (:func:`~.overhead.selective_seconds_per_op`), charged to selective segments.
        nesting_seconds: What a checkpoint nested in another costs a step beyond its own
            machinery (:func:`~.overhead.nesting_seconds`), charged to each inner checkpoint.
    """

    calls: list[ModuleCall]
    storage_bytes: dict[int, int]
    saver: dict[int, int]
    param_grad_bytes: dict[str, int]
    times_called: dict[str, int]
    ops: list[CostlyOp] = field(default_factory=list)
    readers: dict[int, list[tuple[int, int]]] = field(default_factory=dict)
    recording_seconds_per_op: float = 0.0
    checkpoint_seconds: float = 0.0
    selective_seconds_per_op: float = 0.0
    nesting_seconds: float = 0.0

    @property
    def saved_bytes(self) -> int:
        """Bytes of all distinct storages saved for backward in the step."""
        return sum(self.storage_bytes[sid] for sid in self.saver)

    def subtree(self, index: int) -> Iterator[ModuleCall]:
        """The call ``index`` and all calls nested in it."""
        stack = [index]
        while stack:
            call = self.calls[stack.pop()]
            yield call
            stack.extend(child for kind, child in reversed(call.events) if kind == 'call')

    def saves_in(self, index: int) -> set[int]:
        """Storage ids saved inside call ``index`` (children included)."""
        return {sid for call in self.subtree(index)
                for kind, sid in call.events if kind == 'save'}
