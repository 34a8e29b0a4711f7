"""Activation offload's configuration (:class:`OffloadConfig`): checked once, applied in one call.

A configuration names the modules to offload, or the share of a step's saved bytes to offload;
a share is turned into names on a real forward pass (:meth:`OffloadConfig.choose`) before it
is applied. ``ActivationOffloadHook``, the memory budget and the benchmark make one each.

Example:
    >>> from torch import nn
    >>> net = nn.Sequential(nn.Sequential(nn.Linear(8, 8), nn.ReLU()),
    ...                     nn.Sequential(nn.Linear(8, 8), nn.ReLU()))
    >>> config = OffloadConfig(share=0.5).choose(net, lambda: net(torch.randn(4, 8)).sum())
    >>> config.names
    ('0',)
    >>> with config.apply(net) as applied:
    ...     applied.summary
    'activation offload (prefetch) of 1 modules: 0'
    >>> OffloadConfig(share=1.5)
    Traceback (most recent call last):
    ...
    mmdropit.errors.ConfigError: activation offload share must be in (0, 1], got 1.5
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import InitVar, dataclass
from typing import ClassVar

import torch  # noqa: F401  (the doctest's namespace)
from torch import nn

from ..common.name_patterns import checked_list
from ..common.parameters import model_device
from ..common.technique import Applied
from ..errors import ConfigError
from .link import link_bytes_per_second
from .modules import METHODS, Offload, modules_holding_share, offload_activations, restore_offload


@dataclass(frozen=True)
class OffloadConfig:
    """What chosen modules save for backward, kept in pinned host memory (:mod:`.modules`).

    Args:
        names: Name patterns of the modules to offload (``['backbone.layer1']``); or
        share: The share, in ``(0, 1]``, of a step's saved bytes that the earliest blocks (of
            the model's ``nn.Sequential`` block sequences) offloaded hold.
        method: ``'prefetch'`` (side-stream copies, prefetched one module ahead) or
            ``'save_on_cpu'`` (``torch.autograd.graph.save_on_cpu``).
        where: Who gives the values, to start error messages with (not stored).

    Raises:
        ConfigError: Neither or both of ``names`` and ``share``, names that are not a list,
            a share outside ``(0, 1]`` or an unknown method.

    Config example::

        custom_hooks = [dict(type='ActivationOffloadHook', share=0.5)]
    """

    name: ClassVar[str] = 'offload'
    lossy: ClassVar[bool] = False

    names: tuple[str, ...] | None = None
    share: float | None = None
    method: str = 'prefetch'
    where: InitVar[str] = 'activation offload'

    def __post_init__(self, where: str) -> None:
        if (self.names is None) == (self.share is None):
            raise ConfigError(f'{where} takes names=[...] or share=0.5 (one of the two)')
        object.__setattr__(self, 'names', checked_list(
            self.names, f"{where} names take a list, e.g. names=['backbone.layer1']"))
        share = self.share
        if share is not None and (isinstance(share, bool) or not isinstance(share, (int, float))
                                  or not 0 < share <= 1):
            raise ConfigError(f'{where} share must be in (0, 1], got {share!r}')
        if self.method not in METHODS:
            raise ConfigError(f'{where} method {self.method!r}: use one of '
                              f'{", ".join(METHODS)}')

    def choose(self, model: nn.Module, forward: Callable[[], object]) -> OffloadConfig:
        """This configuration with the modules named: for a share, the earliest blocks whose
        saved bytes in ``forward()`` reach it, or what the host link moves while it runs,
        whichever is less (:func:`~.modules.modules_holding_share`, :mod:`.link`)."""
        if self.names is not None:
            return self
        names = modules_holding_share(model, forward, None, self.share,
                                      link_bytes_per_second(model_device(model)))
        return OffloadConfig(names=tuple(names), method=self.method)

    def apply(self, model: nn.Module) -> AppliedOffload:
        """Offload the named modules of ``model`` (:func:`~.modules.offload_activations`).

        Raises:
            ConfigError: For a share not yet turned into names (:meth:`choose`), no module
                matching the names, or a model offloaded already.
        """
        if self.names is None:
            raise ConfigError('activation offload by share: choose the modules on a forward '
                              'pass first (OffloadConfig.choose)')
        return AppliedOffload(model, offload_activations(model, self.names, self.method))

    def to_json(self) -> dict:
        return dict(names=None if self.names is None else list(self.names), share=self.share,
                    method=self.method)



class AppliedOffload(Applied):
    """Activation offload in effect on a model; :meth:`remove` takes it off
    (:func:`~.modules.restore_offload`).

    Attributes:
        offload: The modules offloaded, and the copies' statistics (``offload.copies.stats``).
    """

    def __init__(self, model: nn.Module, offload: Offload) -> None:
        shown = ', '.join(offload.names[:6]) + (', ...' if len(offload.names) > 6 else '')
        super().__init__(lambda: restore_offload(model),
                         f'activation offload ({offload.method}) of {len(offload.names)} '
                         f'modules: {shown}')
        self.offload = offload
