"""Apply and remove checkpoints on modules, in place.

A checkpointed module keeps its Parameters, buffers and ``state_dict`` keys: its class is swapped
(:mod:`mmdropit.common.class_swap`) for a subclass whose ``forward`` runs the original one under
:func:`torch.utils.checkpoint.checkpoint` (non-reentrant: keyword arguments pass through, inputs
need not require grad, nested checkpoints and DDP work). A run of consecutive children of an
``nn.Sequential`` is checkpointed as one piece the same way, on the Sequential. So is a run of
sibling modules that their parent calls one after another, each on what the one before returned
(:func:`checkpoint_siblings`): the first runs them all inside its checkpoint, and the others,
when the parent calls them, pass on the tensor they are given. That holds only while the parent
calls them as when the plan was made: a sibling called with another tensor, other arguments or
out of turn raises a ``RuntimeError``, but a parent that does not call the later siblings at all
(a branch taken on data) goes unnoticed and uses the run's output in their place (a recomputation
may stop after the first sibling, so a missing call is not an error). The planner offers such a
run only where the recorded step called the siblings that way and nothing else read what they
passed on (:mod:`.chain`).

The recomputation starts from what the first pass started from (:mod:`.first_pass`): its
list and dict arguments as they were when the checkpoint was entered (each pass runs on copies,
so neither the caller, as DenseNet appends to its feature list, nor the region itself, as a
multi-branch stage assigns into its list, changes what the other pass sees), and the attributes
and buffers its first pass changed as they were before it; after the recomputation they are
put back, so BatchNorm statistics are those of one forward pass. The RNG state is restored
before recomputing (``preserve_rng_state``), so dropout drops the same elements (a region given
its GPU tensors by keyword or in a list takes an empty tensor on that GPU first, since torch
restores the state of its positional tensors' devices only: :func:`_mark`). Eval mode and
``torch.no_grad`` run the plain forward. Compressed modules inside a plain checkpoint
(:func:`~mmdropit.codecs.compress_activations`) store their codes when the region is recomputed and
placeholders of the codes' size in the first pass, so the checkpoint compares the two passes' saved
tensors as for any region. A *selective* checkpoint (:mod:`.selective`) keeps the outputs of its
costly ops and recomputes only the rest. Under ``torch.compile`` the checkpoints become dynamo's
checkpoint regions (the selective policy passes as a module-level ``context_fn``, the only form
dynamo takes), each pass on its own containers, and the compiled backward does the recomputation.

A top-level checkpoint may keep its inputs in pinned host memory (``host``, a
:class:`~mmdropit.common.host_copies.HostGroup`: a group of the plan's ``HostCopies`` per call):
they travel off the GPU on a side stream during the forward pass, and back one checkpoint ahead
of its recomputation, so the device holds the inputs of the checkpoint being recomputed and of
the one recomputed next instead of all of them (the per-block plan of a ViT keeps its fp32
residual stream). A checkpoint of the plan whose inputs stay on the device (its copy would free
nothing, or the link would not carry it) opens a group that copies nothing, so that its
recomputation still starts the way back of the inputs of the checkpoint before it. What the
checkpoint's region saves is the checkpoint's own. Inside another checkpoint's pass, in a
backward pass and under ``torch.compile`` the inputs stay where they are (on a CPU they always
do).

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
import functools
import sys
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING

import torch
from torch import nn
from torch.utils._pytree import tree_leaves
from torch.utils.checkpoint import checkpoint

from ..common.class_swap import ClassSwap
from ..common.recompute_region import checkpoint_pass, recomputed_region, saved_until_backward
from ..errors import ConfigError
from .first_pass import FirstPass, Region, fresh_containers, has_containers, has_forward_hooks
from .selective import selective_contexts

if TYPE_CHECKING:
    from ..common.host_copies import HostGroup

_SWAP = ClassSwap('Checkpointed')
_WHERE_THEY_ARE = contextlib.nullcontext()
"""What a checkpoint keeping its inputs where they are enters (one context, reused)."""


class _Both:
    """Two contexts entered as one, ``outer`` first (a class: entered twice a checkpoint and
    step, where torch's checkpoint may stop a recomputation early by raising through it). Made
    for contexts that suppress no exception."""

    def __init__(self, outer: contextlib.AbstractContextManager,
                 inner: contextlib.AbstractContextManager) -> None:
        self.outer, self.inner = outer, inner

    def __enter__(self) -> None:
        self.outer.__enter__()
        try:
            self.inner.__enter__()
        except BaseException:
            self.outer.__exit__(*sys.exc_info())
            raise

    def __exit__(self, *exc: object) -> None:
        try:
            self.inner.__exit__(*exc)
        finally:
            self.outer.__exit__(*exc)


def _contexts(first_pass: FirstPass, selective: bool) -> tuple:
    """The checkpoint's forward and recompute contexts. A plain checkpoint marks its first
    pass as one whose saved tensors are dropped (DropIT saves placeholders and selects in the
    recomputation); a selective one marks both passes as kept, since its recomputation replays
    the first pass's ops in order and must meet the same ones, even when it runs inside an outer
    checkpoint's first pass. The recomputation starts from the first pass's module state
    (:meth:`~.first_pass.FirstPass.as_first_seen`), set outside the selective replay so that
    its copies are not among the replayed ops."""
    if not selective:
        return (checkpoint_pass(first=True, region=True),
                _Both(checkpoint_pass(first=False, recomputation=True, region=True),
                      first_pass.as_first_seen()))
    forward, recompute = selective_contexts()
    return (_Both(checkpoint_pass(first=False, region=True), forward),
            _Both(checkpoint_pass(first=False, region=True),
                  _Both(first_pass.as_first_seen(), recompute)))


def _checkpointed(region: Region, run: Callable, selective: bool, host: HostGroup | None,
                  *args, **kwargs):
    """``run(*args, **kwargs)`` as one checkpoint of ``region`` whose recomputation starts from
    what its first pass started from (:mod:`.first_pass`), its inputs kept in ``host`` (when
    given, see the module). Called with grad enabled only (:func:`_active`): eager, the pass
    marks of :func:`_contexts` mark the region, and torch's checkpoint enters them only then."""
    copies = has_containers(args, kwargs)
    if copies:  # the checkpoint's own containers: the caller may change its own later
        args, kwargs = fresh_containers(args, kwargs)
    if torch.compiler.is_compiling():
        # dynamo takes a context_fn only as a module-level function (the selective policy);
        # the compiled backward recomputes without running BatchNorm's buffer updates again
        policy = {'context_fn': selective_contexts} if selective else {}
        return checkpoint(_each_pass(run, copies, region=True), *args, use_reentrant=False,
                          **policy, **kwargs)
    first_pass = FirstPass(region, args, kwargs, copies)
    # only containers, keyword arguments or a host group can need a mark (not called for
    # every checkpoint and step without them)
    mark = _mark(args, kwargs, host, copies) if copies or kwargs or host is not None else None
    with _WHERE_THEY_ARE if host is None else _inputs_kept_in(host):
        output = checkpoint(_each_pass(run, copies, mark is not None),
                            *(() if mark is None else (mark,)), *args, use_reentrant=False,
                            context_fn=lambda: _contexts(first_pass, selective), **kwargs)
    first_pass.finish()
    return output


def _mark(args: tuple, kwargs: dict, host: HostGroup | None,
          containers: bool = True) -> torch.Tensor | None:
    """An empty tensor for the checkpoint to take first (``None``: none is needed). torch's
    non-reentrant checkpoint saves and restores the random state only of the devices of its
    positional tensor arguments, and saves only those: a region that takes its GPU tensors by
    keyword or in a list (a DETR layer's ``query=``) would draw other dropout masks in its
    recomputation, so it takes an empty tensor on that device first; and the recomputation of
    a checkpoint keeping its inputs in host memory starts the way back of the inputs of the
    checkpoint before it when it unpacks what it saved, so one without a positional tensor takes
    an empty one on the CPU (``containers``: whether the positional arguments hold lists,
    tuples or dicts; without them or keyword arguments, what is not a positional tensor is
    nothing torch's checkpoint would miss, and is not looked through)."""
    positional = [arg.device for arg in args if isinstance(arg, torch.Tensor)]
    if (containers or kwargs) and not any(device.type != 'cpu' for device in positional):
        for leaf in tree_leaves((args, kwargs)):
            if isinstance(leaf, torch.Tensor) and leaf.device.type != 'cpu':
                return _empty(leaf.device)
    return _empty(torch.device('cpu')) if host is not None and not positional else None


@functools.cache
def _empty(device: torch.device) -> torch.Tensor:
    """An empty tensor on ``device``, made once (never written)."""
    return torch.empty(0, device=device)


def _inputs_kept_in(host: HostGroup) -> contextlib.AbstractContextManager:
    """Where a checkpoint entered now keeps its inputs: a group of ``host``, unless it is
    inside another checkpoint's pass or a backward pass (then it keeps them where they are)."""
    if not saved_until_backward():
        return _WHERE_THEY_ARE
    return host.open()


def _each_pass(run: Callable, copies: bool, marked: bool = False,
               region: bool = False) -> Callable:
    """``run`` on new containers (``copies``), in the first forward pass and in the
    recomputation alike (``marked``: without the :func:`_mark` passed first), inside
    :func:`~mmdropit.common.recompute_region.recomputed_region` where ``region`` (a compiled
    checkpoint; an eager one's pass contexts mark the region, :func:`_contexts`)."""
    def each_pass(*args, **kwargs):
        if marked:
            args = args[1:]
        if copies:  # the region may change them (xs[i] = branch(xs[i])): each pass its own
            args, kwargs = fresh_containers(args, kwargs)
        if not region:
            return run(*args, **kwargs)
        with recomputed_region():
            return run(*args, **kwargs)
    return each_pass


def _active(module: nn.Module) -> bool:
    return module.training and torch.is_grad_enabled()


class _CheckpointedModule:
    """Mixin: the whole forward of the module is one checkpoint (``_mmdropit_selective``: a
    selective one)."""

    _mmdropit_selective: bool
    _mmdropit_region: Region
    _mmdropit_host: HostGroup | None

    def forward(self, *args, **kwargs):
        forward = super().forward
        if not _active(self):
            return forward(*args, **kwargs)
        return _checkpointed(self._mmdropit_region, forward, self._mmdropit_selective,
                             self._mmdropit_host, *args, **kwargs)


class _CheckpointedRuns:
    """Mixin for ``nn.Sequential``: runs of children (``_mmdropit_runs``: first, last, whether
    selective, where the inputs are kept) are checkpoints, each recomputing a ``nn.Sequential``
    of its children (``_mmdropit_parts``, by first child; made again if the children were
    replaced)."""

    _mmdropit_runs: list[tuple[int, int, bool, HostGroup | None]]
    _mmdropit_parts: dict[int, Region]

    def forward(self, x):
        children = list(self)
        if not _active(self):
            for child in children:
                x = child(x)
            return x
        starts = {first: (last, selective, host)
                  for first, last, selective, host in self._mmdropit_runs}
        i = 0
        while i < len(children):
            if i not in starts:
                x = children[i](x)
                i += 1
                continue
            last, selective, host = starts[i]
            part = self._mmdropit_parts.get(i)
            if part is None or not part.matches(children[i:last + 1]):
                part = self._mmdropit_parts[i] = Region(nn.Sequential(*children[i:last + 1]))
            x = _checkpointed(part, part.root.forward, selective, host, x)
            i = last + 1
        return x


@dataclass(eq=False)
class _SiblingRun:
    """A run of sibling modules checkpointed as one (:func:`checkpoint_siblings`).

    Attributes:
        names: The siblings' names, for messages.
        members: The siblings, in call order.
        region: The siblings as one region (an ``nn.ModuleList`` of them).
        selective: Whether the checkpoint keeps the outputs of its costly ops.
        host: Where the checkpoint keeps its inputs (``None``: where they are).
        output: What the first sibling returned, until the last one has passed it on (a
            recomputation that stops early leaves it, and the next call replaces it).
        turn: Position of the sibling the parent should call next with ``output``.
    """

    names: tuple[str, ...]
    members: tuple[nn.Module, ...]
    region: Region
    selective: bool
    host: HostGroup | None = None
    output: torch.Tensor | None = None
    turn: int = 0

    def out_of_turn(self, what: str) -> RuntimeError:
        return RuntimeError(
            f'checkpoint plan: the siblings {", ".join(self.names)} are one checkpoint, planned '
            f'while their parent called them one after another on one tensor, but {what}; plan '
            'again for this model, or remove the plan (plan.remove(model))')


class _CheckpointedSiblingsHead:
    """Mixin for the first sibling of a run: runs the whole run as one checkpoint, or, in eval
    mode or without grad, itself alone, and then the others run plain (a later sibling's own
    mode does not count: MMDetection's backbones keep BatchNorm layers in eval mode)."""

    _mmdropit_siblings: _SiblingRun

    def forward(self, *args, **kwargs):
        forward = super().forward
        run = self._mmdropit_siblings
        run.output = None
        if not _active(self):  # the others then run plain too, whatever their own mode
            return forward(*args, **kwargs)

        def chained(*inner_args, **inner_kwargs):
            value = forward(*inner_args, **inner_kwargs)
            for member in run.members[1:]:
                value = _SWAP.base_of(member).forward(member, value)
            return value

        run.output, run.turn = _checkpointed(run.region, chained, run.selective, run.host,
                                             *args, **kwargs), 1
        return run.output


class _CheckpointedSiblingsFollower:
    """Mixin for a later sibling of a run: passes on what the first one returned."""

    _mmdropit_siblings: _SiblingRun
    _mmdropit_sibling_position: int

    def forward(self, *args, **kwargs):
        run, position = self._mmdropit_siblings, self._mmdropit_sibling_position
        if run.output is None:  # the first one ran plain (eval mode, no grad)
            return super().forward(*args, **kwargs)
        if run.turn != position or kwargs or len(args) != 1 or args[0] is not run.output:
            run.output = None
            raise run.out_of_turn(f'{run.names[position]} was called with something else')
        run.turn += 1
        output = run.output
        if run.turn == len(run.members):
            run.output = None
        return output


def checkpoint_module(module: nn.Module, selective: bool = False,
                      host: HostGroup | None = None) -> None:
    """Make every call of ``module`` one non-reentrant checkpoint (``selective``: keeping the
    outputs of its costly ops; ``host``: keeping its inputs in host memory, see the module)."""
    _SWAP.swap_in(module, _CheckpointedModule)
    module._mmdropit_selective = selective
    module._mmdropit_region = Region(module)
    module._mmdropit_host = host


def checkpoint_run(sequential: nn.Sequential, first: int, last: int,
                   selective: bool = False, host: HostGroup | None = None) -> None:
    """Checkpoint children ``first..last`` (inclusive) of ``sequential`` as one piece
    (``selective``: keeping the outputs of its costly ops; ``host``: its inputs in host
    memory)."""
    if not isinstance(sequential, nn.Sequential):
        raise TypeError(f'a run checkpoint needs an nn.Sequential, got {type(sequential).__name__}')
    runs = list(getattr(sequential, '_mmdropit_runs', []))
    runs.append((first, last, selective, host))
    _SWAP.swap_in(sequential, _CheckpointedRuns)
    sequential._mmdropit_runs = sorted(runs, key=lambda run: run[0])
    sequential._mmdropit_parts = {}


def checkpoint_siblings(parent: nn.Module, children: tuple[str, ...],
                        selective: bool = False, host: HostGroup | None = None) -> None:
    """Checkpoint children of ``parent`` that it calls one after another, each on what the one
    before returned, as one piece (``selective``: keeping the outputs of its costly ops;
    ``host``: its inputs in host memory).

    The first child runs them all inside its checkpoint; the others pass on what it returned
    when ``parent`` calls them. Failure modes are in this module's docstring.

    Args:
        parent: The module whose ``forward`` calls the children.
        children: Their attribute names, in call order (two or more).

    Raises:
        ValueError: If fewer than two children are given.
        ConfigError: If a child after the first has forward hooks of its own
            (:func:`has_forward_hooks`; hooks registered after this call run when the parent
            calls that child, around the tensor it passes on).

    Example:
        >>> class Stem(nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.conv, self.bn, self.act = nn.Conv2d(3, 4, 3), nn.BatchNorm2d(4), nn.ReLU()
        ...     def forward(self, x):
        ...         return self.act(self.bn(self.conv(x))).mean()
        >>> stem = Stem()
        >>> checkpoint_siblings(stem, ('conv', 'bn', 'act'))
        >>> stem(torch.randn(2, 3, 8, 8)).backward()
        >>> uncheckpoint(stem.conv); uncheckpoint(stem.bn); uncheckpoint(stem.act)
    """
    if len(children) < 2:
        raise ValueError(f'a sibling checkpoint needs two or more children, got {children}')
    members = tuple(parent.get_submodule(child) for child in children)
    hooked = [name for name, member in zip(children[1:], members[1:]) if has_forward_hooks(member)]
    if hooked:
        raise ConfigError(f'a sibling checkpoint would run {", ".join(hooked)} without the '
                          'forward hooks they have (an FSDP2 unit, for one): plan again for '
                          'this model')
    run = _SiblingRun(tuple(children), members, Region(nn.ModuleList(members)), selective,
                      host)
    for position, member in enumerate(members):
        _SWAP.swap_in(member,
                      _CheckpointedSiblingsFollower if position else _CheckpointedSiblingsHead)
        member._mmdropit_siblings = run
        member._mmdropit_sibling_position = position


def is_checkpointed(module: nn.Module) -> bool:
    """Whether :func:`checkpoint_module`, :func:`checkpoint_run` or :func:`checkpoint_siblings`
    was applied to ``module``."""
    return _SWAP.is_swapped(module)


def uncheckpoint(module: nn.Module) -> None:
    """Undo :func:`checkpoint_module` / :func:`checkpoint_run` on ``module``, or
    :func:`checkpoint_siblings` on one sibling (no-op otherwise)."""
    if _SWAP.swap_out(module):
        for key in ('_mmdropit_runs', '_mmdropit_parts', '_mmdropit_selective',
                    '_mmdropit_region', '_mmdropit_host', '_mmdropit_siblings',
                    '_mmdropit_sibling_position'):
            module.__dict__.pop(key, None)


def uncheckpoint_all(model: nn.Module) -> None:
    """Take every checkpoint this package put on ``model`` (or its submodules) off."""
    for module in model.modules():
        if is_checkpointed(module):
            uncheckpoint(module)
