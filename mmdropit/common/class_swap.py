"""Changing what an object is by swapping its class in place, one layer per technique.

A technique (DropIT, compressed activations, a checkpoint plan, the memory budget's optim
wrapper) changes an existing object without replacing it: the object's class becomes a
subclass of its current class with the technique's mixins in front, so its attributes,
Parameters and ``state_dict`` keys stay, and ``isinstance`` checks against its class still
hold. Each technique owns one :class:`ClassSwap`, which makes these classes once per (mixins,
class) pair, so converting two modules of one class gives them one class, and a deep copy of a
converted model is converted the same way. A made class is named after the class it was put
on, with a prefix (``'DropIT'`` + ``'Linear'``); it holds that class as its last base and the
technique that made it in its own ``__dict__``: the one record of what the object was before.

Stacking. Each swap is one layer of the object's class, and layers stack in the order they
are put in: a Linear that DropIT converts and a checkpoint plan then checkpoints is a
``CheckpointedDropITLinear``, whose ``forward`` is the checkpoint's, running DropIT's inside
it through ``super()`` (so DropIT selects in the recomputation); a GELU that compressed
activations convert inside a checkpointed block gets a layer on the GELU's class, apart from
the block's. The rules:

- a technique that swaps an object again replaces its own layer in place (a second run
  checkpointed on one ``nn.Sequential``, a module checkpoint on a checkpointed sibling): one
  layer per technique and object;
- removing a technique's layer takes out that layer wherever it is, and puts the layers
  above it back, in their order, on the class below it: techniques may be removed in any
  order, and removing all of them gives the original class;
- :meth:`ClassSwap.base_of` is the class right below the technique's layer: the object as
  the layers below it made it (a checkpointed run's later siblings call its ``forward``).

Example:
    >>> class Loud:
    ...     def speak(self):
    ...         return super().speak().upper()
    >>> class Twice:
    ...     def speak(self):
    ...         return super().speak() * 2
    >>> class Dog:
    ...     def speak(self):
    ...         return 'woof '
    >>> loud, twice = ClassSwap('Loud'), ClassSwap('Twice')
    >>> dog = Dog()
    >>> loud.swap_in(dog, Loud)
    >>> twice.swap_in(dog, Twice)
    >>> type(dog).__name__, dog.speak(), isinstance(dog, Dog)
    ('TwiceLoudDog', 'WOOF WOOF ', True)
    >>> loud.swap_out(dog), type(dog).__name__, twice.base_of(dog) is Dog
    (True, 'TwiceDog', True)
    >>> twice.swap_out(dog), type(dog) is Dog, twice.is_swapped(dog)
    (True, True, False)
"""
from __future__ import annotations

from typing import NamedTuple

_MADE_BY = '_mmdropit_class_swap'
"""Key, in a made class's own ``__dict__``, of the :class:`_Layer` it is."""


class _Layer(NamedTuple):
    """One swap of an object's class: the technique that made it, and the name prefix."""

    swap: ClassSwap
    prefix: str


def _layers(cls: type) -> tuple[list[tuple[_Layer, tuple[type, ...]]], type]:
    """The layers of ``cls`` with their mixins, outermost first, and the class below them."""
    layers = []
    while (layer := cls.__dict__.get(_MADE_BY)) is not None:
        layers.append((layer, cls.__bases__[:-1]))
        cls = cls.__bases__[-1]
    return layers, cls


class ClassSwap:
    """The class swaps of one technique (the stacking rules are in this module's docstring).

    Args:
        prefix: Put before the name of the class a swap is put on (``'Checkpointed'``), unless
            :meth:`swap_in` is given another.
    """

    def __init__(self, prefix: str = '') -> None:
        self.prefix = prefix
        self._classes: dict[tuple[tuple[type, ...], type, str], type] = {}

    def _made(self, mixins: tuple[type, ...], base: type, prefix: str) -> type:
        """The class ``(*mixins, base)``, made on the first request and the same one after."""
        key = (mixins, base, prefix)
        cls = self._classes.get(key)
        if cls is None:
            cls = type(f'{prefix}{base.__name__}', (*mixins, base),
                       {'__module__': base.__module__, _MADE_BY: _Layer(self, prefix)})
            self._classes[key] = cls
        return cls

    def _restack(self, obj: object, mixins: tuple[type, ...], prefix: str) -> bool:
        """Give ``obj`` its class with this technique's layer replaced by ``mixins`` (none:
        taken out); whether it had one."""
        layers, cls = _layers(type(obj))
        mine = next((i for i, (layer, _) in enumerate(layers) if layer.swap is self), None)
        if mine is None and not mixins:
            return False
        if mine is not None:
            del layers[mine]
        if mixins:
            layers.insert(0 if mine is None else mine, (_Layer(self, prefix), mixins))
        for layer, layer_mixins in reversed(layers):
            cls = layer.swap._made(layer_mixins, cls, layer.prefix)
        obj.__class__ = cls
        return mine is not None

    def swap_in(self, obj: object, *mixins: type, prefix: str | None = None) -> None:
        """Put ``mixins`` in front of ``obj``'s class, in place (as the outermost layer, or in
        place of this technique's layer if it has one); ``prefix`` replaces the default one."""
        if not mixins:
            raise ValueError('a class swap needs one or more mixins')
        self._restack(obj, mixins, self.prefix if prefix is None else prefix)

    def swap_out(self, obj: object) -> bool:
        """Take this technique's layer out of ``obj``'s class, in place; whether it had one."""
        return self._restack(obj, (), '')

    def base_of(self, obj: object) -> type | None:
        """The class right below this technique's layer of ``obj``'s class (``None``: no
        layer)."""
        cls = type(obj)
        while (layer := cls.__dict__.get(_MADE_BY)) is not None:
            if layer.swap is self:
                return cls.__bases__[-1]
            cls = cls.__bases__[-1]
        return None

    def is_swapped(self, obj: object) -> bool:
        """Whether this technique's layer is in ``obj``'s class."""
        return self.base_of(obj) is not None
