"""Techniques whose few settings are each measured on the step (:class:`Switch`): bf16 autocast,
DropIT, quantized activations and activation offload, with the settings each is tried at.

Example:
    >>> from torch import nn
    >>> switch = dropit_switch(nn.Sequential(nn.Linear(4, 4)))
    >>> switch.name, switch.settings, switch.text(0.9), switch.lossy
    ('dropit', (0.5, 0.7, 0.9), 'DropIT gamma 0.9', True)
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..codecs import compress_activations, restore_activations
from ..dropit import convert, from_dropit
from ..offload import block_patterns, modules_holding_share, offload_activations, restore_offload

DROPIT_GAMMAS = (0.5, 0.7, 0.9)
"""The gammas DropIT is tried at when lossy techniques are allowed (the leanest last)."""
ACTIVATION_BITS = (8, 4)
"""The bit widths saved activations are tried at when lossy techniques are allowed (the leanest
last)."""
OFFLOAD_SHARES = (0.5, 1.0)
"""The shares of the saved bytes activation offload is tried at (on a GPU, when asked for)."""


@dataclass(frozen=True)
class Switch:
    """A technique whose settings are each measured on the step: its settings, and how to put
    one in effect and take it away.

    Attributes:
        name: The technique's name (``'bf16'``, ``'dropit'``, ``'quantize'``, ``'offload'``).
        settings: The settings to try, the one that saves the most memory last.
        text: How the decision table names a setting.
        apply: Puts a setting in effect.
        remove: Takes it away.
        lossy: Whether it changes the computed gradients (all but activation offload).
    """

    name: str
    settings: tuple
    text: Callable[[object], str]
    apply: Callable[[object], None]
    remove: Callable[[], None]
    lossy: bool = True


def dropit_switch(model: nn.Module, gammas: Sequence[float] = DROPIT_GAMMAS) -> Switch:
    """DropIT on ``model`` (default layers and exclusions) at each of ``gammas``."""
    return Switch('dropit', tuple(gammas), lambda gamma: f'DropIT gamma {gamma}',
                  lambda gamma: convert(model, gamma), lambda: from_dropit(model))


def quantize_switch(model: nn.Module, bits: Sequence[int] = ACTIVATION_BITS) -> Switch:
    """What ``model``'s normalisation, activation and attention modules save, in each of
    ``bits`` bits (:func:`~mmdropit.codecs.compress_activations` with its default modules)."""
    return Switch('quantize', tuple(bits), lambda width: f'{width}-bit activations',
                  lambda width: compress_activations(model, width),
                  lambda: restore_activations(model))


def offload_switch(model: nn.Module, forward: Callable[[], object],
                   shares: Sequence[float] = OFFLOAD_SHARES) -> Switch:
    """Activation offload (:mod:`mmdropit.offload`) of the earliest blocks of ``model`` holding
    each of ``shares`` of the saved bytes of ``forward()`` (chosen when a share is first
    applied): exact, and worth trying on a GPU only (on CPU nothing moves)."""
    chosen: dict[float, list[str]] = {}

    def apply(share: float) -> None:
        if share not in chosen:
            chosen[share] = modules_holding_share(model, forward, block_patterns(model) or ['*'],
                                                  share)
        offload_activations(model, chosen[share])

    return Switch('offload', tuple(shares), lambda share: f'offload {share} of the saved bytes',
                  apply, lambda: restore_offload(model), lossy=False)


def bf16_switch(holder: object) -> Switch:
    """bfloat16 autocast, switched by setting ``holder.autocast_dtype`` (an optim wrapper with
    :class:`~mmdropit.engine.optim.AutocastSwitch`, a benchmark workload)."""
    return Switch('bf16', (torch.bfloat16,), lambda dtype: 'bf16 autocast',
                  lambda dtype: setattr(holder, 'autocast_dtype', dtype),
                  lambda: setattr(holder, 'autocast_dtype', None))
