"""Cost model: the peak memory and the recompute time of a training step under a plan.

Backward walks the chain from the last item to the first. When it reaches item ``i``, still alive
are: every tensor kept for items up to ``i`` (a tensor saved by several items lives until backward
passes the earliest of them that is not checkpointed, or the checkpoint whose input it is), the
gradients backward has made and not yet passed on (the item's output's; a tensor several items
read, being summed; a parallel branch's, waiting), the gradients of the item's arguments it
makes, and the parameter gradients already produced by the items after ``i`` (and the item's
own parameter gradients, temporaries until autograd accumulates them; and what the item's
backward rebuilds, e.g. a DropIT layer's dense input,
:mod:`mmdropit.common.backward_workspace`). The input batch, which existed before the step, is
not counted (:mod:`.record`). When it reaches a
checkpointed segment, the segment is first recomputed, so everything the segment saves is alive
again on top of what was kept before it, and is then freed item by item as backward goes back
through it.
A checkpoint keeps its inputs from forward to backward; a selective one (:mod:`.selective`) also
keeps the outputs of its costly ops, which its recomputation then reuses; a nested one
(:mod:`.nested`) is recomputed under its inner plan, which the same walk follows.
The peak of the step is the largest of these figures; the forward pass ends with everything
kept, which is never more than the first backward figure.

Two forms of the same model are here: :func:`predict` works on the recorded storages exactly
(a storage shared by several items counts once) and gives the figures a plan reports;
:class:`ChainCosts` is the additive form the solvers search over, where each item's bytes are
attributed to the first item that saves them, with a correction for what a piece right after a
checkpoint keeps: a storage the checkpoint does not keep but the piece does (saved by an item
inside the checkpoint too), and a storage the checkpoint already keeps, which the piece does not
keep twice (a dense layer's input list, which the next dense layer's checkpoint also keeps).
"""
from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import NamedTuple

from .chain import Chain, Segment


@dataclass(frozen=True)
class Prediction:
    """What the cost model expects of one training step under a plan.

    Attributes:
        activation_peak: Peak of kept activations, recomputed activations and gradient
            transients (parameters, parameter gradients, optimizer state excluded).
        step_peak: The same plus the parameter gradients alive at that moment.
        kept_bytes: Bytes kept from forward to backward (the saved activations) on the device.
        recompute_seconds: Forward time spent again in backward.
        host_bytes: Bytes copied to host memory (the top-level checkpoints' inputs of a plan
            that keeps them there, each storage once, also one a later layer keeps on the
            device as well): what the host holds, and the link carries each way.
        host_checkpoints: The positions, in forward order, of the top-level checkpoints that
            keep their inputs in host memory (:func:`hosted_checkpoints`; the others keep theirs
            on the device).
    """

    activation_peak: int
    step_peak: int
    kept_bytes: int
    recompute_seconds: float
    host_bytes: int = 0
    host_checkpoints: tuple[int, ...] = ()


def _transients(chain: Chain, grads: list[int]) -> list[int]:
    """Bytes alive only while each item runs its backward: the gradients backward has made and
    not yet passed on (:func:`_pending_gradients`), the gradients of the item's arguments it
    makes (a pooling layer's or a strided convolution's are larger than its output's; where an
    argument's gradient is already being summed, the new sum too), its workspace and its
    parameters' gradients (``grads``: one module's at a time, :func:`_grad_bytes`)."""
    pending, last_reader = _pending_gradients(chain)
    transients = []
    for i, (item, grad) in enumerate(zip(chain.items, grads)):
        made = 0
        for sid in item.grad_inputs:
            if sid in item.outputs:  # in place (ReLU(inplace=True)): a new gradient all the same
                made += chain.record.storage_bytes[sid]
            else:
                made += chain.record.storage_bytes[sid] * (2 if i < last_reader.get(sid, i)
                                                          else 1)
        transients.append(pending[i] + (0 if item.glue else made) + item.workspace + grad)
    return transients


def _pending_gradients(chain: Chain) -> tuple[list[int], dict[int, int]]:
    """For each item, the bytes of the gradients alive when backward reaches it: of every
    module output made at or before it and read after it (the item's own output's, coming
    in; a tensor several items read, summed from its last reader's backward to its first's;
    a parallel branch's, waiting); and for each storage, the last item reading it.

    A module output lives, as a gradient, from the backward of its last reader (an item, or
    its parent's own code between two items) back to the backward of the item that made it;
    one never read again (the loss) from the start of backward.
    """
    record, count = chain.record, len(chain.items)
    made: dict[int, int] = {}
    for call, (start, stop) in chain.spans.items():
        for sid in record.calls[call].outputs:
            made[sid] = min(made.get(sid, stop - 1), stop - 1)
    last: dict[int, int] = {}
    for i, item in enumerate(chain.items):
        for sid in item.grad_inputs:
            if sid not in item.outputs:
                last[sid] = max(last.get(sid, i), i)
    for sid, reads in record.readers.items():
        for call, at in reads:
            last[sid] = max(last.get(sid, 0), chain.position(call, at))
    delta = [0] * (count + 1)
    for sid, first in made.items():
        end = last.get(sid, count)
        if end > first:
            delta[first] += record.storage_bytes[sid]
            delta[end] -= record.storage_bytes[sid]
    pending, alive = [], 0
    for i in range(count):
        alive += delta[i]
        pending.append(alive)
    return pending, last


def _grad_bytes(chain: Chain, largest: bool = False) -> list[int]:
    """Bytes of the parameter gradients each item's backward makes; with ``largest``, of the
    most one module of the item makes: autograd hands each module's to ``.grad`` right after
    that module's backward, so in an item of several modules (a residual block left whole)
    only one module's are temporaries at a time."""
    record = chain.record
    made = [[record.param_grad_bytes.get(record.calls[c].name, 0) for c in item.grad_owner_calls]
            for item in chain.items]
    return [max(sizes, default=0) if largest else sum(sizes) for sizes in made]


def predict(chain: Chain, segments: list[Segment], inputs_on_host: bool = False,
            host_capacity: float | None = None) -> Prediction:
    """Predict the step under a plan that checkpoints ``segments`` (disjoint; each may hold a
    plan of inner segments), exactly by storage.

    With ``inputs_on_host`` the top-level checkpoints keep their inputs in host memory
    (:mod:`.apply`), those :func:`hosted_checkpoints` chooses for ``host_capacity``: an input
    that moves (:attr:`~.chain.Segment.movable`) and no other item keeps is on the device only
    while backward passes its checkpoint, and the top-level checkpoint after it (its way back
    starts there, also where that one keeps its own inputs on the device: :mod:`.apply`).

    tests/checkpoint/test_plan.py checks the predictions against peaks measured by MemTracker,
    tests/checkpoint/test_inputs_on_host.py those with inputs on the host on a GPU.
    """
    grads = _grad_bytes(chain)
    transients = _transients(chain, _grad_bytes(chain, largest=True))
    grad_after = [0] * (len(chain.items) + 1)
    for i in reversed(range(len(chain.items))):
        grad_after[i] = grad_after[i + 1] + grads[i]
    moments: list[tuple[int, int]] = []  # (activation bytes, parameter-gradient bytes) alive

    hosted: set[int] = set()  # with inputs_on_host, the inputs kept in host memory
    in_order = sorted(segments, key=lambda segment: segment.start)
    found = _host_inputs(chain, in_order, host_capacity) if inputs_on_host else []
    chosen = tuple(k for k, where in enumerate(found) if where.copies)
    on_host = {id(segment): where for segment, where in zip(in_order, found)}
    last = in_order[-1] if in_order else None

    def walk(start: int, stop: int, plan: list[Segment] | tuple[Segment, ...],
             kept: set[int]) -> float:
        """Go through items ``start..stop`` under ``plan`` (the top-level one or an inner one),
        adding to ``kept`` what they keep (to ``hosted`` what its checkpoints keep on the host)
        and to ``moments`` each backward figure; returns the recompute seconds."""
        by_start = {s.start: s for s in plan}
        seconds = 0.0
        ahead: set[int] = set()  # the inputs of the checkpoint before, on their way back
        i = start
        while i < stop:
            segment = by_start.get(i)
            if segment is None:
                kept |= chain.items[i].saves
                moments.append((chain.bytes_of(kept | ahead) + transients[i],
                                grad_after[i + 1]))
                i += 1
                continue
            where = on_host.get(id(segment))
            inputs = where.off_device if where else set()
            hosted.update(where.copied if where else ())
            kept |= {*segment.inputs, *segment.cached} - inputs
            back = kept | inputs | ahead
            ahead = inputs if segment is not last else set()  # the next one fetches them
            seconds += segment.seconds
            if segment.inner:  # recomputed under its inner plan, on top of what is kept
                walk(segment.start, segment.stop, segment.inner, set(back))
            else:  # recomputed, then freed item by item as backward goes from the last back
                inside: set[int] = set()
                for j in range(i, segment.stop):
                    inside |= chain.items[j].saves
                    moments.append((chain.bytes_of(back | inside) + transients[j],
                                    grad_after[j + 1]))
            i = segment.stop
        return seconds

    kept: set[int] = set()
    seconds = walk(0, len(chain.items), segments, kept)
    activation_peak = max((active for active, _ in moments), default=0)
    step_peak = max((active + grad for active, grad in moments), default=0)
    return Prediction(activation_peak, step_peak, chain.bytes_of(kept), seconds,
                      chain.bytes_of(hosted), chosen)


def hosted_checkpoints(chain: Chain, segments: list[Segment],
                       host_capacity: float | None = None) -> tuple[int, ...]:
    """The positions among ``segments`` (top-level checkpoints in chain order) of those that
    keep their inputs in host memory: in forward order, each whose copy frees device memory,
    as long as the copies so far fit in ``host_capacity`` bytes (``None``: no limit), the bytes
    the link carries while the forward pass runs. The copies queue on one stream, so the later
    a copy starts, the less of the forward pass is left to hide it: the first checkpoint whose
    copies do not fit ends the choice of those that copy. A checkpoint copies its movable
    inputs (:attr:`~.chain.Segment.movable`); its copy frees nothing where every one of them is
    kept on the device anyway by an item before it (as the ReLU before a ResNet block's
    checkpointed convolutions keeps its output) or a checkpoint before it: that checkpoint
    keeps its inputs on the device, and takes none of the link. A checkpoint that copies takes
    the link for every movable input no checkpoint before it copied, also one an item before it
    keeps (the copy frees nothing there). An input passed positionally to several checkpoints
    moves once (:class:`~mmdropit.common.host_copies.HostCopies` shares its copy): it takes the
    link once, and a later checkpoint whose inputs are all on the host already, or that keeps
    its own on the device, takes that copy.
    """
    return tuple(k for k, where in enumerate(_host_inputs(chain, segments, host_capacity))
                 if where.copies)


class _OnHost(NamedTuple):
    """Where one top-level checkpoint of a plan with its inputs on the host keeps them.

    Attributes:
        copies: Whether its group copies (:func:`hosted_checkpoints` chose it).
        off_device: The storages of its inputs that are not on the device while it waits for
            backward (copied by it or by a checkpoint before it, and kept by no item or
            checkpoint before it).
        copied: The storages it copies to the host: its movable inputs that no checkpoint
            before it copied, also one an item before it keeps (the copy frees nothing there,
            but takes the link all the same).
    """

    copies: bool
    off_device: set[int]
    copied: set[int]


def _host_inputs(chain: Chain, segments: list[Segment],
                 host_capacity: float | None) -> list[_OnHost]:
    """Where each of ``segments`` keeps its inputs (see :func:`hosted_checkpoints`)."""
    room = math.inf if host_capacity is None else host_capacity
    kept: set[int] = set()
    copied: set[int] = set()
    found: list[_OnHost] = []
    done = 0  # the items before it whose saves are in kept
    for segment in segments:
        for item in chain.items[done:segment.start]:
            kept |= item.saves
        done = segment.stop
        movable = set(segment.movable)
        frees, new = movable - kept, movable - copied
        needs_copies = bool(frees - copied)  # else what it frees is on the host already
        moves = needs_copies and chain.bytes_of(new) <= room
        if moves:
            room -= chain.bytes_of(new)
            copied |= new
        elif needs_copies:
            room = 0.0  # no later copy starts
        off_device = frees if moves else frees & copied
        found.append(_OnHost(moves, off_device, new if moves else set()))
        kept |= {*segment.inputs, *segment.cached} - off_device
    return found


Cut = int | None
"""What the piece before a boundary left kept, as the additive model tells it apart: ``None``
after an item that is not checkpointed, else the :attr:`SegmentCost.cut` of the checkpoint."""


@dataclass(frozen=True)
class SegmentCost:
    """A checkpointable range in the additive model.

    Attributes:
        start: First item. stop: One past the last item.
        inputs: Bytes it keeps (its inputs, and for a selective checkpoint its costly ops'
            outputs) when the item before it is not checkpointed (storages that earlier items
            already keep are left out).
        inputs_after_cut: Bytes it keeps right after a checkpoint whose :attr:`cut` is not in
            ``inputs_after``: all its inputs.
        seconds: Recompute time.
        recompute: Most bytes alive, beyond those kept before it and by it, while it runs its
            backward: recomputed, then freed item by item from the last one back.
        cut: What the pieces right after this checkpoint keep, as an id (checkpoints after
            which they keep the same bytes share it); ``None``: what they keep after no
            checkpoint; ``-1``: not known (they keep all they save).
        inputs_after: Bytes it keeps right after a checkpoint of a given ``cut`` (storages that
            checkpoint keeps, or that items before it save, are left out).
    """

    start: int
    stop: int
    inputs: int
    inputs_after_cut: int
    seconds: float
    recompute: int
    cut: Cut = -1
    inputs_after: Mapping[int, int] = field(default_factory=dict, compare=False)

    def added(self, before: Cut) -> int:
        """Bytes it keeps after a piece that left ``before``."""
        if before is None:
            return self.inputs
        return self.inputs_after.get(before, self.inputs_after_cut)


@dataclass
class ChainCosts:
    """The additive chain model the solvers search over.

    Attributes:
        keep: Bytes item ``i`` keeps when neither it nor the item before it is checkpointed.
        keep_after_cut: Bytes item ``i`` keeps right after a checkpoint whose cut is not in
            ``keep_after``: all it saves (also what it shares with the items inside that
            checkpoint).
        transient: Bytes alive only while item ``i`` runs its backward.
        segments: The checkpointable ranges.
        keep_after: Bytes item ``i`` keeps right after a checkpoint of cut ``c``, by ``(i, c)``
            (storages that checkpoint keeps, or that items before it save, left out).
    """

    keep: list[int]
    keep_after_cut: list[int]
    transient: list[int]
    segments: list[SegmentCost]
    keep_after: dict[tuple[int, int], int] = field(default_factory=dict)

    def item_added(self, i: int, before: Cut) -> int:
        """Bytes item ``i``, not checkpointed, keeps after a piece that left ``before``."""
        if before is None:
            return self.keep[i]
        return self.keep_after.get((i, before), self.keep_after_cut[i])

    def pieces(self, plan: list[SegmentCost]) -> Iterator[tuple[int, int, int]]:
        """Walk the chain under a plan (disjoint segments), one piece at a time: an item left
        as it is, or a checkpointed segment. Yields ``(kept, added, local)``: bytes kept before
        the piece, bytes the piece adds to them, and bytes alive only during its backward."""
        by_start = {s.start: s for s in plan}
        kept = 0
        before: Cut = None
        i = 0
        while i < len(self.keep):
            segment = by_start.get(i)
            if segment is None:
                added = self.item_added(i, before)
                local = self.transient[i]
                before, i = None, i + 1
            else:
                added = segment.added(before)
                local = segment.recompute
                before, i = segment.cut, segment.stop
            yield kept, added, local
            kept += added

    def peak(self, plan: list[SegmentCost]) -> int:
        """Activation peak of a plan (disjoint segments) in this model."""
        return max((kept + added + local for kept, added, local in self.pieces(plan)),
                   default=0)


def chain_costs(chain: Chain, inputs_on_host: bool = False) -> ChainCosts:
    """The additive model of ``chain`` (see :class:`ChainCosts`).

    With ``inputs_on_host`` the checkpoints keep their inputs in host memory (single-level
    plans, :func:`predict`): right after another checkpoint, a checkpoint keeps on the device
    only what does not move (after an item left as it is, an input that item saves stays
    kept by it), and it holds its inputs again while backward passes it (the inputs of the
    checkpoint before it, on their way back then too, are left to the exact prediction).
    """
    saved_before: list[frozenset[int]] = [frozenset()]
    for item in chain.items:
        saved_before.append(saved_before[-1] | item.saves)
    keep = [chain.bytes_of(item.saves - saved_before[i]) for i, item in enumerate(chain.items)]
    keep_after_cut = [chain.bytes_of(item.saves) for item in chain.items]
    transient = _transients(chain, _grad_bytes(chain, largest=True))
    moved = [frozenset(segment.movable if inputs_on_host else ()) for segment in chain.segments]
    held = [frozenset({*segment.inputs, *segment.cached}) - moved[k]
            for k, segment in enumerate(chain.segments)]
    inputs = [chain.bytes_of(kept - saved_before[segment.start])
              for segment, kept in zip(chain.segments, held)]
    starting: dict[int, list[int]] = {}
    for k, segment in enumerate(chain.segments):
        starting.setdefault(segment.start, []).append(k)
    # A checkpoint's cut is what the pieces after it would keep: checkpoints after which they
    # keep the same bytes share one (``None`` where that is what they keep after no checkpoint).
    cuts: dict[tuple[int, tuple[int, ...]], Cut] = {}
    cut_of: list[Cut] = []
    for k, segment in enumerate(chain.segments):
        stop, already = segment.stop, saved_before[segment.start] | held[k]
        if stop == len(chain.items):
            cut_of.append(None)
            continue
        following = starting.get(stop, ())
        after = (chain.bytes_of(chain.items[stop].saves - already),
                 *(chain.bytes_of(held[j] - already) for j in following))
        unplanned = (keep[stop], *(inputs[j] for j in following))
        cut_of.append(None if after == unplanned else cuts.setdefault((stop, after), len(cuts)))
    inputs_after: list[dict[int, int]] = [{} for _ in chain.segments]
    keep_after: dict[tuple[int, int], int] = {}
    for (stop, (item_keeps, *segment_keeps)), cut in cuts.items():
        keep_after[(stop, cut)] = item_keeps
        for j, kept in zip(starting.get(stop, ()), segment_keeps):
            inputs_after[j][cut] = kept

    def segment_cost(k: int, segment: Segment) -> SegmentCost:
        outside = saved_before[segment.start] | held[k]
        inside: set[int] = set(moved[k])  # back on the device while it is recomputed
        recompute = 0
        for j in range(segment.start, segment.stop):
            inside |= chain.items[j].saves
            recompute = max(recompute, chain.bytes_of(inside - outside) + transient[j])
        return SegmentCost(segment.start, segment.stop, inputs[k], chain.bytes_of(held[k]),
                           segment.seconds, recompute, cut_of[k], inputs_after[k])

    return ChainCosts(keep, keep_after_cut, transient,
                      [segment_cost(k, s) for k, s in enumerate(chain.segments)], keep_after)
