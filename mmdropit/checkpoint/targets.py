"""What a checkpoint is put on: one module, a run of children of an ``nn.Sequential``, or a run
of sibling modules that their parent calls one after another on one tensor.

A :class:`ModuleTarget` makes every call of one module a checkpoint; a :class:`RunTarget` makes
children ``first..last`` (inclusive) of an ``nn.Sequential`` one checkpoint; a
:class:`SiblingsTarget` makes consecutive calls of children of any module one checkpoint (a
ResNet's stem: ``conv1``, ``bn1``, ``relu``, ``maxpool``, called by ``ResNet.forward``). Each
may be *selective* (:mod:`.selective`: it keeps the outputs of its costly ops) and may hold, in
``inner``, the targets checkpointed inside it (:mod:`.nested`).

Plan files keep the flat JSON form of earlier versions: one list per target, ``['module',
name]``, ``['run', sequential, first, last]`` or ``['siblings', parent, [child, ...]]``, with
``'selective'`` appended for a selective checkpoint; a nested target is followed by the targets
inside it (recursively), and reading rebuilds the nesting from that order: a target that follows
another and lies inside it is nested in it.

Example:
    >>> plan = [RunTarget('blocks', 0, 2, inner=(ModuleTarget('blocks.1', selective=True),)),
    ...         ModuleTarget('head')]
    >>> flat = targets_to_json(plan); flat
    [['run', 'blocks', 0, 2], ['module', 'blocks.1', 'selective'], ['module', 'head']]
    >>> targets_from_json(flat) == plan
    True
    >>> [(depth, target.where, target.module) for depth, target in walk(plan)]
    [(0, 'blocks[0:3]', 'blocks'), (1, 'blocks.1', 'blocks.1'), (0, 'head', 'head')]
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace

from ..errors import ConfigError

SELECTIVE = 'selective'
"""Last field of a plan-file entry whose checkpoint keeps the outputs of its costly ops."""


def _below(name: str, parent: str) -> str | None:
    """``name`` relative to ``parent`` when it lies strictly below it (``''`` is the model
    itself), else ``None``."""
    if not parent:
        return name or None
    return name[len(parent) + 1:] if name.startswith(f'{parent}.') else None


@dataclass(frozen=True, kw_only=True)
class _Target(ABC):
    """What both kinds of target hold and do alike.

    Attributes:
        selective: Whether the checkpoint keeps the outputs of its costly ops.
        inner: Targets checkpointed inside this one.
    """

    selective: bool = False
    inner: tuple[Target, ...] = ()

    @property
    @abstractmethod
    def module(self) -> str:
        """Name of the module the checkpoint is put on."""

    @property
    @abstractmethod
    def where(self) -> str:
        """What the checkpoint covers, as plans print it."""

    @abstractmethod
    def covers(self, name: str) -> bool:
        """Whether module ``name`` runs inside this checkpoint, as another module than the one
        it is put on."""

    @property
    def occupies(self) -> tuple[str, ...]:
        """Names of the modules this checkpoint changes (one module holds one checkpoint)."""
        return (self.module,)

    @abstractmethod
    def _head(self) -> list:
        """The plan-file entry without the selective mark."""

    def lies_inside(self, outer: Target) -> bool:
        """Whether this checkpoint lies inside ``outer`` (may be nested in it)."""
        return outer.covers(self.module)

    def to_json(self) -> list:
        """This target's entry in a plan file (each ``inner`` target has an entry of its own)."""
        return [*self._head(), *([SELECTIVE] if self.selective else [])]


@dataclass(frozen=True)
class ModuleTarget(_Target):
    """Every call of one module is one checkpoint (``selective`` and ``inner`` as keywords).

    Attributes:
        name: The module's name in ``model.named_modules()``; it is also where the checkpoint
            is put and what plans print.
    """

    name: str

    module = where = property(lambda self: self.name)

    def covers(self, name: str) -> bool:
        """Whether module ``name`` lies below ``self.name``."""
        return _below(name, self.name) is not None

    def _head(self) -> list:
        return ['module', self.name]


@dataclass(frozen=True)
class RunTarget(_Target):
    """Children ``first..last`` (inclusive) of an ``nn.Sequential`` are one checkpoint
    (``selective`` and ``inner`` as keywords); it is put on the ``nn.Sequential``.

    Attributes:
        sequential: The ``nn.Sequential``'s name in ``model.named_modules()``.
        first: Index of the first child in the run.
        last: Index of the last child in the run.
    """

    sequential: str
    first: int
    last: int

    module = property(lambda self: self.sequential)

    @property
    def where(self) -> str:
        """What the checkpoint covers, as plans print it (``blocks[0:3]``: children 0 to 2)."""
        return f'{self.sequential}[{self.first}:{self.last + 1}]'

    def covers(self, name: str) -> bool:
        """Whether module ``name`` is one of the run's children, or lies below one."""
        relative = _below(name, self.sequential)
        child = relative.split('.')[0] if relative else ''
        return child.isdigit() and self.first <= int(child) <= self.last

    def _head(self) -> list:
        return ['run', self.sequential, self.first, self.last]


@dataclass(frozen=True)
class SiblingsTarget(_Target):
    """Children of a module that it calls one after another, each on what the one before
    returned, are one checkpoint (``selective`` and ``inner`` as keywords); it is put on the
    first child, and the others pass on what it returns (:func:`~.apply.checkpoint_siblings`).

    Attributes:
        parent: The calling module's name in ``model.named_modules()`` (``''``: the model).
        children: The children's attribute names, in call order.
    """

    parent: str
    children: tuple[str, ...]

    @property
    def members(self) -> tuple[str, ...]:
        """The children's names in ``model.named_modules()``."""
        return tuple(f'{self.parent}.{child}' if self.parent else child
                     for child in self.children)

    module = property(lambda self: self.members[0])
    occupies = members

    @property
    def where(self) -> str:
        """What the checkpoint covers, as plans print it (``layer.{conv..pool}``)."""
        span = f'{{{self.children[0]}..{self.children[-1]}}}'
        return f'{self.parent}.{span}' if self.parent else span

    def covers(self, name: str) -> bool:
        """Whether module ``name`` is one of the children after the first, or lies below one."""
        return any(name == member or _below(name, member) is not None
                   for member in self.members) and name != self.module

    def _head(self) -> list:
        return ['siblings', self.parent, list(self.children)]


Target = ModuleTarget | RunTarget | SiblingsTarget
"""What one checkpoint of a plan is put on."""


def walk(targets: Iterable[Target], depth: int = 0) -> Iterator[tuple[int, Target]]:
    """Each target, then the targets nested in it (recursively), with its nesting depth
    (``depth`` for ``targets`` themselves)."""
    for target in targets:
        yield depth, target
        yield from walk(target.inner, depth + 1)


def targets_to_json(targets: Iterable[Target]) -> list[list]:
    """The plan-file form of ``targets``: each target's entry followed by those nested in it."""
    return [target.to_json() for _, target in walk(targets)]


def _unreadable(what: str, value: object) -> ConfigError:
    return ConfigError(f'this checkpoint plan file is not one this version of mmdropit reads '
                       f'({what} {value!r}); plan again to write a new one')


def target_from_json(entry: object) -> Target:
    """One plan-file entry as a target (with nothing nested in it).

    Raises:
        ConfigError: If ``entry`` is not a target this version writes.
    """
    match entry:
        case ['module', str() as name, *rest] if rest in ([], [SELECTIVE]):
            return ModuleTarget(name, selective=bool(rest))
        case ['run', str() as sequential, int() as first, int() as last, *rest] if (
                rest in ([], [SELECTIVE]) and 0 <= first <= last):
            return RunTarget(sequential, first, last, selective=bool(rest))
        case ['siblings', str() as parent, [str(), str(), *_] as children, *rest] if (
                rest in ([], [SELECTIVE]) and all(isinstance(c, str) for c in children)):
            return SiblingsTarget(parent, tuple(children), selective=bool(rest))
    raise _unreadable('target', entry)


def targets_from_json(entries: object) -> list[Target]:
    """Read the plan-file form (:func:`targets_to_json`, or a plan file of an earlier version)
    back into targets, nesting each target in the one before it that it lies inside.

    Raises:
        ConfigError: If ``entries`` is not a list of targets this version writes.
    """
    if not isinstance(entries, list):
        raise _unreadable('targets', entries)
    flat = [target_from_json(entry) for entry in entries]

    def nest(start: int, outer: Target | None) -> tuple[list[Target], int]:
        """The targets from ``flat[start]`` on that lie inside ``outer`` (all when ``None``),
        nested, and the index after them."""
        nested, i = [], start
        while i < len(flat) and (outer is None or flat[i].lies_inside(outer)):
            inner, after = nest(i + 1, flat[i])
            nested.append(replace(flat[i], inner=tuple(inner)))
            i = after
        return nested, i

    return nest(0, None)[0]
