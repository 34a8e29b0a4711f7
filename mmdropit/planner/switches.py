"""Techniques whose few settings are each measured on the step (:class:`Switch`): bf16 autocast,
DropIT, quantized activations, activation offload and rebuilt activations, with the settings
each is tried at. The settings of DropIT, quantized activations, offload and rebuilt
activations are their configurations (:class:`~mmdropit.dropit.DropITConfig`,
:class:`~mmdropit.codecs.CompressionConfig`, :class:`~mmdropit.offload.OffloadConfig`,
:class:`~mmdropit.codecs.RebuiltActivationsConfig`), applied and removed through them.

Example:
    >>> from torch import nn
    >>> switch = dropit_switch(nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)))
    >>> switch.name, [config.gamma for config in switch.settings], switch.lossy
    ('dropit', [0.5, 0.7, 0.9], True)
    >>> switch.text(switch.settings[-1])
    'DropIT gamma 0.9'
"""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn

from ..codecs import CompressionConfig, RebuiltActivationsConfig
from ..common.parameters import model_device
from ..common.technique import Applied, TechniqueConfig
from ..dropit import DropITConfig
from ..kernels.cuda import codecs_usable
from ..offload import OffloadConfig
from ..precision import MixedPrecisionConfig

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
        name: The technique's name (``'bf16'``, ``'dropit'``, ``'quantize'``, ``'offload'``,
            ``'rebuilt'``).
        settings: The settings to try, the one that saves the most memory last.
        text: How the decision table names a setting.
        apply: Puts a setting in effect.
        remove: Takes it away.
        lossy: Whether it changes the computed gradients (all but activation offload and
            rebuilt activations).
        simple: Whether the simple recipe uses it (bf16 autocast): see
            :class:`~.techniques.Technique`.
    """

    name: str
    settings: tuple
    text: Callable[[object], str]
    apply: Callable[[object], None]
    remove: Callable[[], None]
    lossy: bool = True
    simple: bool = False


def config_switch(name: str, model: nn.Module, configs: Sequence[TechniqueConfig],
                  text: Callable[[TechniqueConfig], str],
                  prepare: Callable[[TechniqueConfig], TechniqueConfig] | None = None) -> Switch:
    """A switch whose settings are the technique ``configs``, each applied to ``model`` (after
    ``prepare``, when given) and removed through the handle its application returned."""
    applied: list[Applied] = []

    def apply(config: TechniqueConfig) -> None:
        applied.append((prepare(config) if prepare else config).apply(model))

    def remove() -> None:
        while applied:
            applied.pop().remove()

    return Switch(name, tuple(configs), text, apply, remove, lossy=configs[0].lossy)


def dropit_switch(model: nn.Module, gammas: Sequence[float] = DROPIT_GAMMAS) -> Switch:
    """DropIT on ``model`` (default layers and exclusions) at each of ``gammas``."""
    return config_switch('dropit', model, [DropITConfig(gamma) for gamma in gammas],
                         lambda config: f'DropIT gamma {config.gamma}')


def quantize_unavailable(model: nn.Module) -> str | None:
    """Why quantized activations are not offered for ``model`` (``None``: they are): on a GPU
    only when their codecs' Triton kernels can run there
    (:func:`~mmdropit.kernels.cuda.codecs_usable`); their eager PyTorch path is too slow to be
    worth its memory."""
    device = model_device(model)
    if device.type == 'cuda' and not codecs_usable(torch.empty(0, device=device)):
        return ("8- and 4-bit activations are not offered on a GPU without their codecs' Triton "
                'kernels (Triton missing, or MMDROPIT_FUSED=0): eager, a DeiT-S step measured '
                '9-10x slower with them on an H100')
    return None


def quantize_switch(model: nn.Module, bits: Sequence[int] = ACTIVATION_BITS) -> Switch:
    """What ``model``'s normalisation, activation and attention modules save, in each of
    ``bits`` bits (:class:`~mmdropit.codecs.CompressionConfig` with its default modules)."""
    return config_switch('quantize', model, [CompressionConfig(width) for width in bits],
                         lambda config: f'{config.bits}-bit activations')


def offload_switch(model: nn.Module, forward: Callable[[], object],
                   shares: Sequence[float] = OFFLOAD_SHARES) -> Switch:
    """Activation offload (:mod:`mmdropit.offload`) of the earliest blocks of ``model`` holding
    each of ``shares`` of the saved bytes of ``forward()`` (chosen when a share is first
    applied): exact, and worth trying on a GPU only (on CPU nothing moves)."""
    chosen: dict[OffloadConfig, OffloadConfig] = {}

    def named(config: OffloadConfig) -> OffloadConfig:
        if config not in chosen:
            chosen[config] = config.choose(model, forward)
        return chosen[config]

    return config_switch('offload', model, [OffloadConfig(share=share) for share in shares],
                         lambda config: f'offload {config.share} of the saved bytes', named)


def rebuilt_switch(model: nn.Module) -> Switch:
    """Rebuilt activations (:mod:`mmdropit.codecs.rebuilt_activations`) on ``model``'s GELU /
    SiLU / Hardswish / Mish activations: exact, one setting."""
    return config_switch('rebuilt', model, [RebuiltActivationsConfig()],
                         lambda config: 'rebuilt activations')


def bf16_switch(holder: object) -> Switch:
    """bfloat16 autocast (:class:`~mmdropit.precision.MixedPrecisionConfig`), switched by
    setting ``holder.switched_precision`` (an optim wrapper with
    :class:`~mmdropit.engine.optim.AutocastSwitch`, a benchmark workload)."""
    return Switch('bf16', (MixedPrecisionConfig('bfloat16'),), lambda config: 'bf16 autocast',
                  lambda config: setattr(holder, 'switched_precision', config),
                  lambda: setattr(holder, 'switched_precision', None), simple=True)
