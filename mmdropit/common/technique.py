"""One technique, one object: a frozen configuration, checked when it is made, put on a model in
one call, and taken away through what that call returns.

Every memory technique of the plugin has such a configuration (``DropITConfig``,
``CompressionConfig``, ``OffloadConfig``, and the checkpoint plan, ``CheckpointPlan``); the
hooks, the memory budget's candidates, the benchmark's variants and the FSDP wrapper all make
one and call :meth:`TechniqueConfig.apply`, so a value is checked once, with one message, and a
technique is put in effect one way.

Example:
    >>> from torch import nn
    >>> class Frozen:                              # a toy technique: freeze the weights
    ...     name, lossy = 'frozen', True
    ...     def apply(self, model):
    ...         params = [p for p in model.parameters() if p.requires_grad]
    ...         for p in params:
    ...             p.requires_grad_(False)
    ...         return Applied(lambda: [p.requires_grad_(True) for p in params], 'frozen')
    ...     def to_json(self):
    ...         return {}
    >>> net = nn.Linear(2, 2)
    >>> isinstance(Frozen(), TechniqueConfig)
    True
    >>> with Frozen().apply(net) as applied:
    ...     net.weight.requires_grad, applied.summary
    (False, 'frozen')
    >>> net.weight.requires_grad
    True
"""
from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import fields
from typing import ClassVar, Protocol, TypeVar, runtime_checkable

from torch import nn

from ..errors import ConfigError

Config = TypeVar('Config')


class Applied:
    """A technique in effect on a model: :meth:`remove` takes it away (once; later calls do
    nothing), and so does leaving a ``with`` block opened on it.

    Attributes:
        summary: What was applied, for logs (e.g. ``'DropIT on 48 layers ...'``).
    """

    def __init__(self, remove: Callable[[], object], summary: str = '') -> None:
        self._remove: Callable[[], object] | None = remove
        self.summary = summary

    def remove(self) -> None:
        """Take the technique away (a no-op the second time)."""
        remove, self._remove = self._remove, None
        if remove is not None:
            remove()

    def __enter__(self) -> Applied:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.remove()


@runtime_checkable
class TechniqueConfig(Protocol):
    """A technique's configuration: frozen and checked when made (a bad value is one
    :class:`~mmdropit.errors.ConfigError` naming it).

    Attributes:
        name: How decisions and logs name the technique (``'dropit'``, ``'quantize'``, ...).
        lossy: Whether it changes the computed gradients.
    """

    name: ClassVar[str]
    lossy: ClassVar[bool]

    def apply(self, model: nn.Module) -> Applied:
        """Put the technique in effect on ``model`` (in place; Parameters and ``state_dict``
        keys unchanged)."""

    def to_json(self) -> dict:
        """The configuration as JSON, from which its class makes it again
        (``type(config)(**config.to_json())``)."""


def config_from(kind: type[Config], options: Mapping[str, object], where: str) -> Config:
    """The configuration ``kind(**options)`` that ``where`` gives as a dict (a config file's
    ``dropit=dict(gamma=0.9)``), an unknown key being one line naming the known ones.

    Example:
        >>> from mmdropit.dropit import DropITConfig
        >>> config_from(DropITConfig, {'gama': 0.9}, 'dropit')  # doctest: +ELLIPSIS
        Traceback (most recent call last):
        ...
        mmdropit.errors.ConfigError: dropit takes exclude, gamma, layers, ...; got gama
    """
    known = sorted(field.name for field in fields(kind))
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ConfigError(f'{where} takes {", ".join(known)}; got {", ".join(unknown)}')
    return kind(**options, where=where)
