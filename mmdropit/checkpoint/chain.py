"""From a recorded step to a chain of items and the segments a plan may checkpoint.

The module-call tree of :class:`~.record.StepRecord` is cut into a chain: the model's call is
expanded into its timeline (child calls in order, and the model's own saves between them), and a
child call that saves a large share of the step's bytes is expanded the same way, down to calls
small enough or without children. The chain's items are those leaf calls and the *glue* between
them (tensors saved by a parent's own code, e.g. a residual branch's ops written in ``forward``).

A segment is a range of items that one non-reentrant checkpoint can cover:

- every call of a module called once in the step (its range spans all its items, glue included:
  residual blocks, FPN necks, detection heads with several outputs are recomputed as a whole);
- a run of two or more consecutive children of an ``nn.Sequential`` (stages of blocks);
- a run of two or more sibling calls that their parent's code makes one after another, each on
  the very tensor the one before returned, where no other code reads what the run's calls pass
  between them (a ResNet's or an Inception's stem, written as module attributes called in
  ``forward``): the record knows which calls read each output.

Each segment that runs costly ops (matrix products, convolutions, attention) also comes in a
*selective* variant (:mod:`.selective`): it keeps those ops' outputs as well as its inputs, and
recomputes only the rest, so its recompute time is the segment's time less theirs.

No segment starts at a call whose input is changed in place later (it could not be recomputed),
none contains the last item (recomputing it right away saves nothing), and none covers a call
that needs no gradient.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

from torch import nn

from ..common.blocks import block_lists, block_sequences, innermost, inside
from .first_pass import has_forward_hooks
from .step_record import ModuleCall, StepRecord
from .targets import ModuleTarget, RunTarget, SiblingsTarget, Target

DEFAULT_GRANULARITY = 48
"""A call is split into its children when it saves more than ``1 / DEFAULT_GRANULARITY`` of the
step's bytes."""

LARGEST_SIBLING_RUN = 0.5
"""Runs of siblings saving more than this share of the step's bytes are left out: they join
whole stages (a ResNet's ``layer1..layer4``), which module segments and ``nn.Sequential`` runs
already cover finely, and their nested variants took most of the search time (ResNet-101:
planning 10.2 s with them)."""


@dataclass
class Item:
    """A piece of the chain: a leaf call, or glue saved by a parent's own code.

    Attributes:
        call: Index of the leaf call, or of the parent whose own code saved the glue.
        glue: Whether the item is glue.
        saves: Storage ids the item saves for backward.
        outputs: Storage ids the item returns (for glue: nothing).
        grad_inputs: Storage ids of its arguments that require grad (for glue: nothing): its
            backward makes their gradients while its outputs' are alive.
        grad_owner_calls: Calls whose own parameters get their gradient in this item's backward.
        ops: The costly ops the item runs (indices into ``StepRecord.ops``).
        workspace: The largest backward workspace one of its calls announced (a DropIT layer's
            rebuilt input); zero for glue.
    """

    call: int
    glue: bool
    saves: set[int] = field(default_factory=set)
    outputs: tuple[int, ...] = ()
    grad_inputs: tuple[int, ...] = ()
    grad_owner_calls: list[int] = field(default_factory=list)
    ops: list[int] = field(default_factory=list)
    workspace: int = 0


@dataclass(frozen=True)
class Segment:
    """A range ``[start, stop)`` of items that one checkpoint can cover.

    Attributes:
        start: First item.
        stop: One past the last item.
        target: Where the checkpoint is put (:mod:`.targets`); whether it is selective and
            what is nested in it are this segment's ``selective`` and ``inner``
            (:attr:`plan_target` is the target with both).
        inputs: Storage ids of the segment's inputs (kept alive by the checkpoint).
        movable: Those a checkpoint that keeps its inputs in host memory moves there
            (:attr:`~.step_record.ModuleCall.movable_inputs` of its first call).
        seconds: Recompute time: the segment's forward time (less its costly ops' if selective).
        selective: Whether the checkpoint keeps the outputs of its costly ops.
        cached: Storage ids of those outputs (kept alive too; empty unless selective).
        inner: Segments checkpointed inside this one (:mod:`.nested`; ``seconds`` then
            includes their recomputation).
        ops_run: ATen ops the segment's calls run (a selective checkpoint's dispatch mode
            costs host time on each, :func:`~.overhead.selective_seconds_per_op`).
    """

    start: int
    stop: int
    target: Target
    inputs: tuple[int, ...]
    seconds: float
    movable: tuple[int, ...] = ()
    selective: bool = False
    cached: tuple[int, ...] = ()
    inner: tuple[Segment, ...] = ()
    ops_run: int = 0

    @property
    def plan_target(self) -> Target:
        """The plan's target for this segment: ``target``, selective or not, with the targets
        of the segments nested in it."""
        return replace(self.target, selective=self.selective,
                       inner=tuple(segment.plan_target for segment in self.inner))


@dataclass
class Chain:
    """Items in forward order and the segments over them.

    Attributes:
        items: The chain's items, in forward order.
        segments: The checkpointable segments over them.
        record: The recorded step.
        spans: For each call the chain visited, the range ``(start, stop)`` of its items (a
            call inside an item is not in it).
        searches: What plan searches on this chain built and solved (their costs and search
            spaces), kept for the next search on it.
        blocks: The recorded model's repeated blocks: the names of its sequences and lists of
            blocks (:func:`repeated_blocks`).
    """

    items: list[Item]
    segments: list[Segment]
    record: StepRecord
    spans: dict[int, tuple[int, int]] = field(default_factory=dict)
    blocks: tuple[str, ...] = ()
    searches: dict[object, object] = field(default_factory=dict, repr=False, compare=False)

    def segments_of(self, targets: Sequence[Target]) -> list[Segment] | None:
        """The segments checkpointed as ``targets`` (:attr:`Segment.plan_target`), in their
        order; ``None`` where one of them is not a segment of this chain."""
        by_target = {segment.plan_target: segment for segment in self.segments}
        found = [by_target.get(target) for target in targets]
        return None if None in found else found

    def position(self, call: int, at: int) -> int:
        """Where in the chain an ATen op that ``call``'s own code ran as op number ``at``
        happened: the index of the item it ran in, or for a call split into items, of the
        first item after the children that had returned by then."""
        calls = self.record.calls
        inner = call
        while inner not in self.spans:
            inner = calls[inner].parent
        start, stop = self.spans[inner]
        if inner != call or (stop - start == 1 and self.items[start].call == inner):
            return start
        where = start
        for kind, child in calls[inner].events:
            if kind == 'call' and calls[child].ended_at <= at and child in self.spans:
                where = self.spans[child][1]
        return where

    def bytes_of(self, storage_ids: set[int] | tuple[int, ...]) -> int:
        """Bytes of the given storages."""
        return sum(self.record.storage_bytes[sid] for sid in set(storage_ids))


def _expandable(call: ModuleCall, threshold: float, blocks: tuple[str, ...]) -> bool:
    """Whether ``call`` is split into its children: one that saves more than ``threshold``
    bytes, or that is or holds one of the ``blocks`` sequences (so that each block is an item,
    and can be a checkpoint of the per-block plan, however little it saves)."""
    has_children = any(kind == 'call' for kind, _ in call.events)
    holds_blocks = any(block == call.name or inside(block, call.name) for block in blocks)
    return has_children and (call.parent in (None, 0) or call.saved_bytes > threshold
                             or holds_blocks)


def build_chain(record: StepRecord, model: nn.Module,
                granularity: int = DEFAULT_GRANULARITY) -> Chain:
    """Cut the call tree of ``record`` into a chain and list its checkpointable segments.

    Args:
        record: The recorded step.
        model: The recorded model (to know which modules are ``nn.Sequential``).
        granularity: Calls saving more than ``1 / granularity`` of the step's bytes are split.
    """
    threshold = record.saved_bytes / granularity
    items: list[Item] = []
    ranges: dict[int, tuple[int, int]] = {}
    blocks = repeated_blocks(record, model)

    def visit(index: int) -> None:
        call = record.calls[index]
        start = len(items)
        if not _expandable(call, threshold, blocks):
            subtree = list(record.subtree(index))
            ops = sorted(value for c in subtree for kind, value in c.events if kind == 'op')
            items.append(Item(index, False, record.saves_in(index), call.outputs,
                              call.grad_inputs, [c.index for c in subtree], ops,
                              max(c.backward_workspace for c in subtree)))
        else:
            glue: Item | None = None
            for kind, value in call.events:
                if kind == 'call':
                    glue = None
                    visit(value)
                    continue
                if glue is None:
                    glue = Item(index, True)
                    items.append(glue)
                if kind == 'save':
                    glue.saves.add(value)
                else:
                    glue.ops.append(value)
            owner = items[start] if len(items) > start else None
            if owner is None:
                items.append(Item(index, True))
                owner = items[start]
            owner.grad_owner_calls.append(index)
        ranges[index] = (start, len(items))

    visit(0)
    modules = dict(model.named_modules())
    segments: list[Segment] = []
    last = len(items)
    for index, (start, stop) in ranges.items():
        call = record.calls[index]
        if index == 0 or record.times_called.get(call.name) != 1:
            continue
        if stop < last and not call.inplace_hazard and call.needs_grad:
            segments.append(Segment(start, stop, ModuleTarget(call.name), call.inputs,
                                    call.seconds, call.movable_inputs, ops_run=_ops_run([call])))
        module = modules.get(call.name)
        expanded = stop - start > 1 or items[start].call != index
        if (expanded and isinstance(module, nn.Sequential)
                and type(module).forward is nn.Sequential.forward):
            segments.extend(_sequential_runs(call, record, ranges, last))
        elif expanded:
            segments.extend(_sibling_runs(call, record, ranges, last, modules))
    # every checkpoint costs its machinery besides the recomputation (:mod:`.overhead`)
    segments = [replace(s, seconds=s.seconds + record.checkpoint_seconds) for s in segments]
    segments += [variant for variant in (_selective(s, items, record) for s in list(segments))
                 if variant is not None]
    segments.sort(key=lambda s: (s.start, s.stop, s.selective))
    return Chain(items, segments, record, ranges, blocks)


def repeated_blocks(record: StepRecord, model: nn.Module) -> tuple[str, ...]:
    """The names of ``model``'s block sequences (:func:`~mmdropit.common.blocks.block_sequences`)
    and of its lists of blocks that ``record`` (a step of ``model``) called one after another,
    each on what the one before returned, the innermost of those
    (:func:`~mmdropit.common.blocks.block_lists`, :func:`chained_blocks`)."""
    return (*(name for name, _ in block_sequences(model)),
            *innermost([name for name, listed in block_lists(model)
                        if chained_blocks(record, name, len(listed))]))


def chained_blocks(record: StepRecord, name: str, count: int) -> bool:
    """Whether the ``count`` children of the module ``name`` ran in ``record`` as blocks: each
    called once, in order, each on a tensor the one before returned (their other arguments, as
    a Swin block's window shape, may be anything)."""
    by_name = {call.name: call for call in record.calls[1:]}
    calls = [by_name.get(f'{name}.{index}' if name else str(index)) for index in range(count)]
    return (None not in calls
            and all(record.times_called.get(call.name) == 1 for call in calls)
            and all(after.index > before.index and set(after.inputs) & set(before.outputs)
                    for before, after in zip(calls, calls[1:])))


def _ops_run(calls: Sequence[ModuleCall]) -> int:
    """ATen ops ``calls`` ran, each with the calls nested in it."""
    return sum(call.ended_at - call.started_at for call in calls)


def _selective(segment: Segment, items: list[Item], record: StepRecord) -> Segment | None:
    """The selective variant of ``segment``, if it runs costly ops that can be kept."""
    ops = [record.ops[k] for item in items[segment.start:segment.stop] for k in item.ops]
    if not ops or any(op.changed_in_place for op in ops):
        return None
    seconds = max(segment.seconds - sum(op.seconds for op in ops), 0.0) + \
        segment.ops_run * record.selective_seconds_per_op
    cached = tuple(dict.fromkeys(sid for op in ops for sid in op.outputs))
    return replace(segment, seconds=seconds, selective=True, cached=cached)


def _sequential_runs(call: ModuleCall, record: StepRecord, ranges: dict[int, tuple[int, int]],
                     last: int) -> list[Segment]:
    children = [record.calls[value] for kind, value in call.events if kind == 'call']
    runs = []
    for first in range(len(children)):
        head = children[first]
        if head.inplace_hazard or not head.needs_grad:
            continue
        seconds = head.seconds
        for final in range(first + 1, len(children)):
            seconds += children[final].seconds
            stop = ranges[children[final].index][1]
            if first == 0 and final == len(children) - 1 or stop >= last:
                continue  # the whole Sequential is its module segment; never the last item
            runs.append(Segment(ranges[head.index][0], stop,
                                RunTarget(call.name, first, final), head.inputs, seconds,
                                head.movable_inputs,
                                ops_run=_ops_run(children[first:final + 1])))
    return runs


def _sibling_runs(call: ModuleCall, record: StepRecord, ranges: dict[int, tuple[int, int]],
                  last: int, modules: dict[str, nn.Module]) -> list[Segment]:
    """Runs of two or more child calls that ``call``'s own code makes one after another, each
    on what the one before returned, whose passed-on tensors no other code reads."""
    runs, largest = [], LARGEST_SIBLING_RUN * record.saved_bytes
    for chained in _passing_chains(call, record, modules):
        for first in range(len(chained) - 1):
            head = chained[first]
            if head.inplace_hazard:
                continue
            region = {c.index for c in record.subtree(head.index)}
            saved = record.saves_in(head.index)
            for final in range(first + 1, len(chained)):
                region |= {c.index for c in record.subtree(chained[final].index)}
                start, stop = ranges[head.index][0], ranges[chained[final].index][1]
                if stop >= last or (start, stop) == ranges[call.index]:
                    continue
                saved |= record.saves_in(chained[final].index)
                if sum(record.storage_bytes[sid] for sid in saved) > largest:
                    break
                if not _passed_on_inside(chained[first:final + 1], region, record):
                    continue
                names = tuple(c.name[len(call.name) + 1:] if call.name else c.name
                              for c in chained[first:final + 1])
                runs.append(Segment(start, stop, SiblingsTarget(call.name, names), head.inputs,
                                    sum(c.seconds for c in chained[first:final + 1]),
                                    head.movable_inputs,
                                    ops_run=_ops_run(chained[first:final + 1])))
    return runs


def _passing_chains(call: ModuleCall, record: StepRecord,
                    modules: dict[str, nn.Module]) -> list[list[ModuleCall]]:
    """The longest sequences of ``call``'s child calls in which each child took, as its one
    argument, the very tensor the one before returned (not a view or a slice of it), with no
    save or costly op of ``call``'s own code between them. Each child is called once in the step
    and needs a gradient; one with forward hooks of its own (an FSDP2 unit, for one) only starts
    a sequence, since a run calls the later siblings' ``forward`` itself."""
    chains: list[list[ModuleCall]] = [[]]
    for kind, value in call.events:
        child = record.calls[value] if kind == 'call' else None
        if child is None or record.times_called.get(child.name) != 1 or not child.needs_grad:
            chains.append([])
            continue
        previous = chains[-1][-1] if chains[-1] else None
        if (previous is not None and previous.result is not None
                and previous.result == child.argument
                and not has_forward_hooks(modules[child.name])):
            chains[-1].append(child)
        else:
            chains.append([child])
    return [chained for chained in chains if len(chained) > 1]


def _passed_on_inside(run: list[ModuleCall], region: set[int], record: StepRecord) -> bool:
    """Whether what ``run``'s calls pass on is read only inside it (``region``: the calls in
    its subtrees): every read of an earlier call's output after that call returned comes from
    inside, or, for a storage the run returns (an in-place or identity last call), after the
    run."""
    final = run[-1]
    for call in run[:-1]:
        for sid in call.outputs:
            returned = sid in final.outputs
            if any(reader not in region and at > call.ended_at
                   and not (returned and at > final.ended_at)
                   for reader, at in record.readers.get(sid, ())):
                return False
    return True
