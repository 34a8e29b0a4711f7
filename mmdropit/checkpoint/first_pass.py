"""What a checkpoint's recomputation starts from: the arguments and module state of its first pass.

A checkpoint runs its region twice, the first forward pass (whose saved tensors it drops) and,
in backward, the recomputation. Its gradients are the unplanned step's only if the
recomputation starts from exactly what the first pass started from. Four things could differ,
and each is kept as the first pass found it:

- **Container arguments** (lists, tuples, dicts, nested): the caller may change them after the
  call (DenseNet appends to the feature list it passes each layer), and the region itself may
  change them in its first pass (a multi-branch stage assigns ``xs[i] = branch(xs[i])``). The
  checkpoint holds its own copy, and each pass runs on new containers around the same tensors
  (:func:`fresh_containers`).
- **Tensors inside containers changed in place** before the recomputation: PyTorch's checkpoint
  checks the version of each tensor argument, not of tensors in containers;
  :meth:`FirstPass.as_first_seen` checks those and raises a ``RuntimeError`` naming the region.
- **Module attributes the forward reassigns** (a counter, a value it caches and reads again):
  the recomputation runs with the values from before the first pass, and the values found when
  it starts are put back after it. Modules of torch.nn's own classes without forward hooks are
  not watched (:func:`_may_reassign`).
- **Buffers the forward writes in place or reassigns**: the same. A write is seen by the
  buffer's version counter; the running statistics of a training BatchNorm / InstanceNorm,
  which the batch-norm kernel updates without counting, are taken as written at every call.
  Such a module normalises with the batch's statistics, never reading them, so they are not
  copied before the pass, only put back after the recomputation (the statistics are those of
  one pass). Other buffers are copied before every first pass once one has been seen to change
  them (the region's first call copies them all); a buffer that starts changing later cannot be
  given its earlier value, and the first pass raises a ``RuntimeError`` naming it.

Not covered: state changed in place that is neither a buffer nor a container argument (a list
attribute appended to, a plain tensor attribute written in place), and global state other than
the RNG and autocast (which the checkpoint restores itself).

Example:
    >>> from torch import nn
    >>> class Counted(nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.linear, self.calls = nn.Linear(2, 2), 0
    ...     def forward(self, xs):
    ...         self.calls += 1
    ...         xs[0] = self.linear(xs[0]) * self.calls
    ...         return xs[0]
    >>> module = Counted()
    >>> region = Region(module)
    >>> args, kwargs = fresh_containers(([torch.ones(1, 2)],), {})
    >>> first = FirstPass(region, args, kwargs)
    >>> out = module(*fresh_containers(args, kwargs)[0])   # the first pass: calls 0 -> 1
    >>> first.finish()
    >>> with first.as_first_seen():                        # the recomputation sees calls == 0
    ...     again = module(*fresh_containers(args, kwargs)[0])
    >>> torch.equal(out, again), module.calls, len(args[0])
    (True, 1, 1)
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass

import torch
from torch import nn
from torch.nn.modules import module as module_hooks
from torch.nn.modules.batchnorm import _NormBase
from torch.utils._pytree import tree_leaves, tree_map
from torch.utils.hooks import RemovableHandle

from ..common.training_state import values_restored

_CONTAINERS = (list, tuple, dict)
_MISSING = object()


def has_containers(args: tuple, kwargs: dict) -> bool:
    """Whether any argument is a list, tuple or dict (the arguments each pass copies)."""
    for value in args:  # a loop, not any(): called for every checkpoint and step
        if isinstance(value, _CONTAINERS):
            return True
    for value in kwargs.values():
        if isinstance(value, _CONTAINERS):
            return True
    return False


def fresh_containers(args: tuple, kwargs: dict) -> tuple[tuple, dict]:
    """New lists, tuples and dicts around the same tensors and other leaves."""
    return tree_map(lambda leaf: leaf, (args, kwargs))


@dataclass(frozen=True)
class _BufferSlot:
    """Where a buffer lives (looked up at each call: ``model.to()`` replaces buffer tensors)."""

    owner: nn.Module
    name: str
    label: str

    @property
    def statistics(self) -> bool:
        """A running statistic of a training BatchNorm / InstanceNorm: written by its forward
        (by the kernel, which leaves the version counter as it was), never read by it."""
        return (isinstance(self.owner, _NormBase) and self.owner.training
                and self.owner.track_running_stats)

    def tensor(self) -> torch.Tensor | None:
        return self.owner._buffers.get(self.name)


class Region:
    """The modules and buffer slots of what one checkpoint recomputes, taken when it is applied
    (a submodule replaced later is not seen: apply the plan after such changes).

    Attributes:
        root: The module (or the ``nn.Sequential`` / ``nn.ModuleList`` of a run) recomputed.
        watched: ``root`` and the modules inside it whose attributes the forward may
            reassign: all but those of torch.nn's own classes (:func:`_may_reassign`) without
            forward hooks of their own, or all where global forward hooks are set (looked at
            again at a call after any hook was registered, :meth:`look_again`).
        hooks_seen: ``torch.utils.hooks.RemovableHandle.next_id`` when :attr:`watched` was
            found (every hook registered moves it on).
        slots: The buffers of ``root`` and of the modules inside it.
        copied_before: Indices of ``slots`` copied before every first pass (``None`` until the
            first call, which copies every slot but BatchNorm statistics).
    """

    def __init__(self, root: nn.Module) -> None:
        self.root = root
        named = list(root.named_modules(remove_duplicate=True))
        self._own = tuple(module for _, module in named if _may_reassign(type(module)))
        self._torch_nn = tuple(module for _, module in named if not _may_reassign(type(module)))
        self.hooks_seen = -1
        self.watched: tuple[nn.Module, ...] = ()
        self.look_again()
        self.slots = tuple(_BufferSlot(module, name, f'{prefix}.{name}' if prefix else name)
                           for prefix, module in named for name in module._buffers)
        self.copied_before: set[int] | None = None

    def look_again(self) -> None:
        """Find :attr:`watched` again among the modules the region was made with: a forward
        hook may have been registered since. Every hook registration moves :attr:`hooks_seen`
        on, a tensor's too: where one is registered at every step (FSDP2 puts one on its
        outputs, a full backward hook on its module's), each call looks again, about 3 us for
        a timm ViT block's 17 modules of torch.nn's classes on this project's CPU."""
        self.hooks_seen = RemovableHandle.next_id
        hooked = _global_forward_hooks()
        self.watched = self._own + tuple(module for module in self._torch_nn
                                         if hooked or has_forward_hooks(module))

    def matches(self, members: list[nn.Module]) -> bool:
        """Whether ``root`` holds exactly ``members``, in order (for a run of children)."""
        return len(self.root) == len(members) and all(
            a is b for a, b in zip(self.root, members))


class FirstPass:
    """What one call's first pass started from, and how to start its recomputation from it.

    Made just before the checkpoint runs the first pass; :meth:`finish` just after it.
    """

    def __init__(self, region: Region, args: tuple, kwargs: dict,
                 containers: bool | None = None) -> None:
        """``containers``: whether the arguments hold lists, tuples or dicts, where the caller
        knows (:func:`has_containers`)."""
        self.region = region
        if region.hooks_seen != RemovableHandle.next_id:
            region.look_again()
        self._attributes = [(module, module.__dict__.copy()) for module in region.watched]
        self._tensors: list[torch.Tensor | None] = []
        self._versions: list[int | None] = []
        self._before: dict[int, torch.Tensor] = {}
        if region.slots:
            self._note_slots()
        self._leaves: list[tuple[torch.Tensor, int]] = []
        if has_containers(args, kwargs) if containers is None else containers:
            self._leaves = [(leaf, leaf._version) for leaf in tree_leaves((args, kwargs))
                            if isinstance(leaf, torch.Tensor)]
        self.attributes: list[tuple[nn.Module, str, object]] = []
        self.buffers: list[tuple[int, torch.Tensor | None]] = []
        self.replaced: list[tuple[_BufferSlot, torch.Tensor]] = []
        self.finished = False

    def _note_slots(self) -> None:
        """Note the buffers' tensors and versions, and copy those the first pass may write."""
        region = self.region
        self._tensors = [slot.tensor() for slot in region.slots]
        self._versions = [None if t is None else t._version for t in self._tensors]
        copied = region.copied_before
        self._before = {
            index: tensor.detach().clone() for index, (slot, tensor)
            in enumerate(zip(region.slots, self._tensors))
            if tensor is not None and (index in copied if copied is not None
                                       else not slot.statistics)}

    def finish(self) -> None:
        """Note what the first pass changed (attributes reassigned, buffers written in place);
        :meth:`as_first_seen` calls it if the first pass was cut short (an outer checkpoint's
        recomputation stops once it has what its backward needs).

        Raises:
            RuntimeError: If a buffer other than BatchNorm statistics was written in place that
                earlier calls left alone (its value from before this pass was not kept).
        """
        for module, before in self._attributes:
            if _differs(module.__dict__, before):
                self.attributes += [(module, key, before.get(key, _MISSING))
                                    for key in module.__dict__.keys() | before.keys()
                                    if module.__dict__.get(key, _MISSING)
                                    is not before.get(key, _MISSING)]
        self._attributes = []
        if self.region.slots:
            self._note_buffers()
        self.finished = True

    def _note_buffers(self) -> None:
        """:meth:`finish` for the buffers."""
        region, written = self.region, []
        for index, (slot, tensor, version) in enumerate(
                zip(region.slots, self._tensors, self._versions)):
            if tensor is None:
                continue
            if slot.tensor() is not tensor:  # a new tensor assigned to the buffer
                self.replaced.append((slot, tensor))
            elif slot.statistics or tensor._version != version:
                written.append(index)
        unknown = [region.slots[i].label for i in written
                   if i not in self._before and not region.slots[i].statistics]
        if region.copied_before is None:
            region.copied_before = set()
        region.copied_before.update(i for i in written if not region.slots[i].statistics)
        if unknown:
            raise RuntimeError(
                f'checkpoint of {type(region.root).__name__}: its forward wrote the buffer(s) '
                f'{", ".join(unknown)} in place, which earlier calls left alone, so the '
                'recomputation cannot start from their values before this pass; run again '
                '(they are copied from now on), or leave this module out of the plan')
        self.buffers = [(i, self._before.get(i)) for i in written]
        self._before, self._tensors, self._versions = {}, [], []

    def as_first_seen(self) -> contextlib.AbstractContextManager:
        """Around the recomputation: the attributes and buffers the first pass changed hold
        their values from before it, and get back the ones found on entry on exit.

        Raises:
            RuntimeError: On entry, if a tensor inside a container argument was changed in
                place since the first pass started.
        """
        return _AsFirstSeen(self)

    def _restoring(self) -> contextlib.AbstractContextManager | None:
        """What entering the recomputation checks (see :meth:`as_first_seen`), and the context
        that restores the state the first pass changed (``None``: it changed none)."""
        if not self.finished:
            self.finish()
        for leaf, version in self._leaves:
            if leaf._version != version:
                raise RuntimeError(
                    f'checkpoint of {type(self.region.root).__name__}: a tensor in a list or '
                    'dict argument was changed in place after the checkpoint was entered, so '
                    'the recomputation would not see what the first pass saw; plan again '
                    '(plan_checkpoints starts no checkpoint there) or leave this module out')
        return self._restored() if self.attributes or self.replaced or self.buffers else None

    @contextlib.contextmanager
    def _restored(self) -> Iterator[None]:
        found = [(module, key, module.__dict__.get(key, _MISSING))
                 for module, key, _ in self.attributes]
        found_buffers = [(slot, slot.tensor()) for slot, _ in self.replaced]
        _assign(self.attributes)
        for slot, tensor in self.replaced:
            slot.owner._buffers[slot.name] = tensor
        slots = self.region.slots
        written = [(slots[i].tensor(), before) for i, before in self.buffers]
        written = [(tensor, before) for tensor, before in written if tensor is not None]
        with values_restored(tensor for tensor, _ in written):  # the values found, on exit
            with torch.no_grad():
                for tensor, before in written:
                    if before is not None:
                        tensor.copy_(before)
            try:
                yield
            finally:
                _assign(found)
                for slot, tensor in found_buffers:
                    slot.owner._buffers[slot.name] = tensor


class _AsFirstSeen:
    """The context of :meth:`FirstPass.as_first_seen` (a class: entered once a checkpoint and
    step, where torch's checkpoint may stop the recomputation early by raising through it; a
    generator's is entered only where there is state to restore)."""

    def __init__(self, first_pass: FirstPass) -> None:
        self.first_pass = first_pass
        self.restoring: contextlib.AbstractContextManager | None = None

    def __enter__(self) -> None:
        self.restoring = self.first_pass._restoring()
        if self.restoring is not None:
            self.restoring.__enter__()

    def __exit__(self, *exc: object) -> bool | None:
        return None if self.restoring is None else self.restoring.__exit__(*exc)


def _may_reassign(cls: type) -> bool:
    """Whether a module of class ``cls`` may reassign its attributes in forward so that the
    recomputation would read other values: any class but torch.nn's own, whose attributes are
    not watched, since a block is mostly made of them (a timm ViT block: 5 of its 22 modules
    watched). Where torch.nn's modules reassign attributes in forward (an RNN's flat weights,
    a lazy module's shapes, a ``weight_norm`` or ``prune`` reparametrisation's weight), they
    work the values out afresh before reading them; a subclass defined elsewhere may do
    anything. This package's swapped classes keep their base's module, and their forward
    methods assign no attribute."""
    return not cls.__module__.startswith('torch.nn.modules.')


def has_forward_hooks(module: nn.Module) -> bool:
    """Whether ``module`` has forward hooks or pre-hooks of its own (FSDP2 gathers a unit's
    parameters in one; a hook may reassign attributes): a run of siblings calls the later ones'
    ``forward`` without them."""
    return bool(module._forward_hooks or module._forward_pre_hooks)


def _global_forward_hooks() -> bool:
    """Whether forward hooks or pre-hooks are set for every module
    (``torch.nn.modules.module.register_module_forward_hook``)."""
    return bool(getattr(module_hooks, '_global_forward_hooks', None)
                or getattr(module_hooks, '_global_forward_pre_hooks', None))


def _differs(current: dict, before: dict) -> bool:
    """Whether a module's attributes were reassigned (compared by ``==`` after identity, which
    is fast in C; a reassigned tensor compares elementwise and may raise: then it differs)."""
    try:
        return current != before
    except Exception:  # noqa: BLE001 -- an ambiguous tensor comparison: something changed
        return True


def _assign(values: list[tuple[nn.Module, str, object]]) -> None:
    for module, key, value in values:
        if value is _MISSING:
            module.__dict__.pop(key, None)
        else:
            module.__dict__[key] = value
