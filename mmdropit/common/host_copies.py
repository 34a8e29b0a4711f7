"""Saved tensors kept in pinned host memory: copied off the GPU on a side stream during the
forward pass and prefetched back, one group ahead, during the backward pass.

A *group* is what one offloaded module saved in one call (:mod:`mmdropit.offload`), or the
inputs of one call of a checkpoint that keeps them in host memory
(:mod:`mmdropit.checkpoint.apply`; :class:`HostGroup`). A group may also keep what it saves on
the device and only mark a place in the backward pass: a checkpoint of a plan with its inputs on
the host whose copy would free nothing starts the way back of the group before it, as one that
copies does. Its pack hook (:meth:`HostCopies.pack`) starts a device-to-
host copy of each saved CUDA tensor on a side stream and lets the caching allocator reuse the
device memory once that copy is done (``Tensor.record_stream``). A tensor saved again, in its
group or a later one, unchanged (the input of separate query, key and value projections; an
input passed positionally to several checkpoints with their inputs on the host) shares the
copy that its first save made: it moves once each way, and a group that keeps what it saves
on the device takes the copy too, since the device tensor frees nothing while a copy holds
it. The forward pass does not wait
for it, unless more than ``in_flight_bytes`` are still travelling: then the host waits for the
oldest copies. The allocator reuses a block only once it has seen its copy end, and the host
runs ahead of the GPU: without that bound a forward pass faster than the copies would hold
everything it offloads until the copies catch up, and save nothing. In the backward pass the
first tensor unpacked from a group starts the host-to-device copies of the group that the
forward pass ran before it, so that they travel while this group's gradients are computed; a
tensor whose copy was not started yet is fetched when asked for. The compute stream waits on an
event per group, never the host.

The baseline to beat is ``torch.autograd.graph.save_on_cpu(pin_memory=True)``: it copies in the
compute stream (the forward pass waits for each copy) and fetches each tensor when the
backward pass asks for it.

Tensors that stay where they are: CPU tensors (on a machine without a GPU offload changes
nothing), parameters, tensors under :data:`MIN_BYTES`, and with ``move_leaves=False`` every
tensor autograd did not make (no ``grad_fn``: the data batch, which its caller holds anyway).

Failure modes: a tensor saved by an offloaded module and also held elsewhere (a module output
the next, not offloaded, layer saves too) stays on the GPU as well, so the copy frees nothing;
compare the step peak, not only the bytes moved. Saved-tensor hooks take autograd's check of a
saved tensor changed in place off everything saved inside them; the copies make it themselves
(the same error when backward asks for the tensor), for a tensor that moved while it is alive
(one changed and then freed before backward goes unseen). Pinned host memory is page-locked:
offloading more than the host can lock slows the whole machine.

Example:
    >>> copies = HostCopies()
    >>> x = torch.randn(64, 64, requires_grad=True)
    >>> with copies.group():
    ...     y = (x * x).sum()
    >>> y.backward()          # on CPU the tensors stay where they are
    >>> copies.stats.bytes_moved, torch.equal(x.grad, 2 * x)
    (0, True)
"""
from __future__ import annotations

import collections
import contextlib
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from .saved_tensors import report_kept

MIN_BYTES = 1 << 16
"""Smaller saved tensors stay on the device (their copies cost more than they free)."""
IN_FLIGHT_BYTES = 256 << 20
"""Bytes of device-to-host copies that may be under way before the forward pass waits."""


@dataclass
class OffloadStats:
    """What a :class:`HostCopies` moved.

    Attributes:
        bytes_moved: Bytes copied to host memory in forward passes.
        tensors_moved: How many tensors.
        shared: Saves that took the copy an earlier save of the same tensor made.
        prefetched: Saves of copied tensors whose way back had started before backward asked
            for them.
        fetched_on_demand: Saves of copied tensors fetched when asked for (the first group of
            each backward pass, and any whose prefetch had not started).
        waits: Times the forward pass waited for copies (more than ``in_flight_bytes`` under
            way).
    """

    bytes_moved: int = 0
    tensors_moved: int = 0
    shared: int = 0
    prefetched: int = 0
    fetched_on_demand: int = 0
    waits: int = 0


def _check_unchanged(tensor: torch.Tensor | None, version: int) -> None:
    """Raise autograd's error for a saved ``tensor`` (``None``: freed since) whose version
    counter is no longer the ``version`` it was saved at: saved-tensor hooks take autograd's
    own check off what they keep.

    Raises:
        RuntimeError: It was changed in place (a copy of it may hold either value).
    """
    if tensor is not None and tensor._version != version:
        raise RuntimeError(
            f'one of the variables needed for gradient computation has been modified by an '
            f'inplace operation: a saved tensor of shape {tuple(tensor.shape)} is at version '
            f'{tensor._version}, saved at version {version}; change it out of place')


@dataclass(eq=False)
class _Kept:
    """A saved tensor that stays where it is, its version counter when saved, and its group."""

    tensor: torch.Tensor
    version: int
    group: int


@dataclass(eq=False)
class _HostCopy:
    """One saved tensor in host memory, and its way back once started.

    Attributes:
        source: The saved tensor, weakly held, and ``version``, its version counter when copied
            (checked while it is alive: one changed and then freed goes unseen).
    """

    host: torch.Tensor
    device: torch.device
    source: weakref.ref
    version: int
    on_device: torch.Tensor | None = None
    arrived: torch.cuda.Event | None = None


@dataclass(eq=False)
class _Copied:
    """One save of a tensor kept in host memory (saves of one tensor share its copy)."""

    copy: _HostCopy
    group: int


@dataclass
class _Groups:
    """The saves of copied tensors of each group still waiting for backward, weakly held
    (autograd owns them: a group whose graph is dropped unused empties itself)."""

    next_index: int = 0
    members: dict[int, weakref.WeakSet] = field(default_factory=dict)

    def start(self) -> int:
        for index in [index for index, copies in self.members.items() if not copies]:
            del self.members[index]
        self.next_index += 1
        return self.next_index - 1


class HostCopies:
    """Keep the tensors saved inside :meth:`group` blocks in pinned host memory.

    Args:
        in_flight_bytes: Device-to-host copies that may be under way before the forward pass
            waits for the oldest (see the module doc).
        move_leaves: Whether tensors without a ``grad_fn`` move too (a checkpoint's inputs:
            ``False``, since the data batch is held by its caller; an output made without
            gradients, as a frozen stem's, then stays as well).

    Example (a step of a CUDA model with its first half offloaded)::

        copies = HostCopies()
        with copies.group():
            hidden = model.first_half(x)
        loss = model.second_half(hidden).sum()
        loss.backward()
        print(copies.stats)
    """

    def __init__(self, in_flight_bytes: int = IN_FLIGHT_BYTES, move_leaves: bool = True) -> None:
        self.stats = OffloadStats()
        self.in_flight_bytes = in_flight_bytes
        self.move_leaves = move_leaves
        self._groups = _Groups()
        self._streams: dict[torch.device, torch.cuda.Stream] = {}
        self._in_flight: collections.deque[tuple[torch.cuda.Event, int]] = collections.deque()
        self._copies: weakref.WeakValueDictionary[int, _HostCopy] = \
            weakref.WeakValueDictionary()  # by id() of the tensor copied, while saves hold them
        self._current = -1
        self._copying = True

    @contextlib.contextmanager
    def group(self, copy: bool = True) -> Iterator[None]:
        """Offload what autograd saves inside the block, as one group (``copy`` false: keep it
        on the device). The first tensor of the group unpacked in backward starts the way back
        of the group before it: after the group's own copies, where it has any waiting."""
        self._current, outer = self._groups.start(), self._current
        self._copying, outer_copying = copy, self._copying
        try:
            with torch.autograd.graph.saved_tensors_hooks(self.pack, self.unpack):
                yield
        finally:
            self._current, self._copying = outer, outer_copying

    def _stream(self, device: torch.device) -> torch.cuda.Stream:
        if device not in self._streams:
            self._streams[device] = torch.cuda.Stream(device)
        return self._streams[device]

    def pack(self, tensor: torch.Tensor) -> _Kept | _Copied:
        """Start copying ``tensor`` to pinned host memory, or take the copy an earlier save of
        it made (or keep it, see the module doc)."""
        copy = self._copies.get(id(tensor))
        if copy is not None and copy.source() is tensor and copy.version == tensor._version:
            self.stats.shared += 1
            return self._saved(copy)
        if (not self._copying or not tensor.is_cuda or tensor.nbytes < MIN_BYTES
                or tensor.is_leaf and (tensor.requires_grad or not self.move_leaves)):
            report_kept(tensor)
            return _Kept(tensor, tensor._version, self._current)
        stream = self._stream(tensor.device)
        stream.wait_stream(torch.cuda.current_stream(tensor.device))
        host = torch.empty_like(tensor, device='cpu', pin_memory=True)  # its layout kept
        with torch.cuda.stream(stream):
            host.copy_(tensor.detach(), non_blocking=True)
        tensor.record_stream(stream)  # its memory is reused only once the copy is done
        self._bound_in_flight(stream.record_event(), tensor.nbytes)
        copy = _HostCopy(host, tensor.device, weakref.ref(tensor), tensor._version)
        self._copies[id(tensor)] = copy
        self.stats.bytes_moved += tensor.nbytes
        self.stats.tensors_moved += 1
        return self._saved(copy)

    def _saved(self, copy: _HostCopy) -> _Copied:
        saved = _Copied(copy, self._current)
        self._groups.members.setdefault(self._current, weakref.WeakSet()).add(saved)
        return saved

    def _bound_in_flight(self, copied: torch.cuda.Event, nbytes: int) -> None:
        self._in_flight.append((copied, nbytes))
        travelling = sum(size for _, size in self._in_flight)
        while self._in_flight and (travelling > self.in_flight_bytes
                                   or self._in_flight[0][0].query()):
            event, size = self._in_flight.popleft()
            if not event.query():
                event.synchronize()
                self.stats.waits += 1
            travelling -= size

    def _fetch(self, copy: _HostCopy) -> None:
        stream = self._stream(copy.device)
        with torch.cuda.stream(stream):
            copy.on_device = copy.host.to(copy.device, non_blocking=True)
            copy.arrived = stream.record_event()

    def _prefetch_group(self, index: int) -> None:
        for saved in list(self._groups.members.pop(index, ())):
            if saved.copy.on_device is None:
                self._fetch(saved.copy)

    def unpack(self, saved: _Kept | _Copied) -> torch.Tensor:
        """The saved tensor on its device; starts the way back of the group before it."""
        if isinstance(saved, _Kept):
            _check_unchanged(saved.tensor, saved.version)
            if saved.group not in self._groups.members:  # else its first copy starts it
                self._prefetch_group(saved.group - 1)
            return saved.tensor
        copy = saved.copy
        _check_unchanged(copy.source(), copy.version)
        if copy.on_device is None:  # the first of its group, or its prefetch never started
            self.stats.fetched_on_demand += 1
            self._fetch(copy)
            self._prefetch_group(saved.group)
        else:
            self.stats.prefetched += 1
        self._prefetch_group(saved.group - 1)
        compute = torch.cuda.current_stream(copy.device)
        compute.wait_event(copy.arrived)
        tensor = copy.on_device
        tensor.record_stream(compute)  # made on the side stream, used on this one
        return tensor


@dataclass(frozen=True)
class HostGroup:
    """Where a checkpoint keeps its inputs: one group of ``copies`` per call (``copy`` false:
    a group that keeps them on the device, see the module).

    Example:
        >>> copies = HostCopies()
        >>> with HostGroup(copies, copy=False).open():
        ...     pass
    """

    copies: HostCopies
    copy: bool = True

    def open(self) -> contextlib.AbstractContextManager:
        """The group of this call (:meth:`HostCopies.group`)."""
        return self.copies.group(self.copy)
