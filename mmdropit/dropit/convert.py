"""Convert a model's layers to DropIT in place (:func:`convert_model`, for a checked
:class:`~.config.DropITConfig`) and back (:func:`from_dropit`).

Layer names are qualified module names (``'blocks.0.mlp.fc1'``). A pattern selects a layer when it
equals the name, is a prefix of it at a dot (``'backbone.layer1'`` selects every layer inside), or
matches it as an ``fnmatch`` wildcard (``'*.qkv'``).

By default, as in the DropIT paper, the first layer (it sees the raw input) and the
classifier / box-predictor layers are left exact: a timm model's ``get_classifier()`` and the
layers matching :data:`PREDICTOR_PATTERNS` (mmdet's ``fc_cls``, ``fc_reg``, ``rpn_cls``, ...).

Example:
    >>> from mmdropit.dropit.config import DropITConfig
    >>> net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.ReLU(),
    ...                     nn.Flatten(), nn.Linear(128, 10))
    >>> report = convert_model(net, DropITConfig(gamma=0.9, exclude=['0', '5']))
    >>> report.layers, report.activations
    (['2'], ['1', '3'])
    >>> from_dropit(net) is net
    True
"""
from __future__ import annotations

import fnmatch
import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import torch
from torch import nn

from ..common.name_patterns import matches
from ..errors import ConfigError
from .layers import (DROPIT_TYPES, LEAN_ACTIVATION_TYPES, convert_activation, convert_layer,
                     is_converted, is_dropit_layer, restore_layer)
from .state import DropITState

if TYPE_CHECKING:
    from .config import DropITConfig

PREDICTOR_PATTERNS = ('*fc_cls', '*fc_reg', '*rpn_cls', '*rpn_reg', '*conv_logits', '*conv_cls',
                      '*conv_reg', '*retina_cls', '*retina_reg')
"""Box / mask predictors of mmdet heads, left exact by default."""

Gamma = float | Mapping[str, float]


@dataclass
class ConversionReport:
    """What :func:`convert` did.

    Attributes:
        layers: Names of the layers converted to DropIT.
        activations: Names of the activations made lean.
        excluded: Supported layers left exact by ``exclude`` (or the defaults).
        frozen: Supported layers left alone because their weight needs no gradient.
    """

    layers: list[str] = field(default_factory=list)
    activations: list[str] = field(default_factory=list)
    excluded: list[str] = field(default_factory=list)
    frozen: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        return (f'DropIT on {len(self.layers)} layers, {len(self.activations)} lean activations; '
                f'left exact: {len(self.excluded)} excluded, {len(self.frozen)} frozen')


def _warn_unmatched(patterns: Iterable[str], names: Sequence[str], what: str) -> None:
    for pattern in patterns:
        if not any(matches(name, pattern) for name in names):
            shown = ', '.join(names[:40]) + (', ...' if len(names) > 40 else '')
            warnings.warn(f'DropIT {what} pattern {pattern!r} matches no supported layer; '
                          f'the supported layers are: {shown}', stacklevel=4)


def default_exclude(model: nn.Module) -> list[str]:
    """The layers left exact by default: the first supported layer, every timm classifier
    (``get_classifier()``) and the mmdet predictors of :data:`PREDICTOR_PATTERNS`."""
    names = {id(module): name for name, module in model.named_modules()}
    supported = [name for name, module in model.named_modules()
                 if isinstance(module, DROPIT_TYPES)]
    excluded = supported[:1]
    for module in model.modules():
        get_classifier = getattr(module, 'get_classifier', None)
        if callable(get_classifier):
            try:
                classifier = get_classifier()
            except (AttributeError, TypeError, NotImplementedError):
                continue
            if isinstance(classifier, nn.Module) and id(classifier) in names:
                excluded.append(names[id(classifier)])
    excluded += [name for name in supported
                 if any(fnmatch.fnmatchcase(name, p) for p in PREDICTOR_PATTERNS)]
    return excluded


def _gamma_for(name: str, gamma: Gamma) -> float | None:
    if isinstance(gamma, Mapping):
        for pattern, value in gamma.items():
            if matches(name, pattern):
                return value
        return None
    return gamma


def convert_model(model: nn.Module, config: DropITConfig) -> ConversionReport:
    """Convert ``model`` in place as ``config`` says, and report what was converted.

    Raises:
        ConfigError: If no supported layer is left to convert.
    """
    gamma, layers, exclude = config.gammas, config.layers, config.exclude
    named = [(name, module) for name, module in model.named_modules()
             if isinstance(module, DROPIT_TYPES)]
    names = [name for name, _ in named]
    if not named:
        raise ConfigError(
            f'DropIT found no supported layer in {type(model).__name__}: it converts nn.Linear, '
            'nn.Conv1d/2d/3d and their subclasses (and transformers\' Conv1D); check that the '
            'model is built before converting it')
    if layers is not None:
        _warn_unmatched(layers, names, 'layers')
    if exclude is not None:
        _warn_unmatched(exclude, names, 'exclude')
    excluded_patterns = default_exclude(model) if exclude is None else list(exclude)
    if isinstance(gamma, Mapping):
        _warn_unmatched(gamma, names, 'gamma')

    report = ConversionReport()
    for name, module in named:
        layer_gamma = _gamma_for(name, gamma)
        if ((layers is not None and not any(matches(name, p) for p in layers))
                or layer_gamma is None):
            continue
        if any(matches(name, p) for p in excluded_patterns):
            report.excluded.append(name)
        elif not module.weight.requires_grad:
            report.frozen.append(name)
        else:
            state = DropITState(name, layer_gamma, layer_gamma, config.strategy,
                                config.value_bits)
            state.reset_counters(module.weight.device)  # where the inputs will most likely be
            convert_layer(module, state)
            report.layers.append(name)
    if not report.layers:
        raise ConfigError(
            f'DropIT converted no layer of {type(model).__name__}: {len(report.excluded)} '
            f'excluded, {len(report.frozen)} frozen of {len(names)} supported; '
            'loosen `layers` / `exclude`')
    if config.lean_activations:
        for name, module in model.named_modules():
            if isinstance(module, LEAN_ACTIVATION_TYPES) and convert_activation(module):
                report.activations.append(name)
    return report


def from_dropit(model: nn.Module) -> nn.Module:
    """Undo :func:`~.config.to_dropit` in place (DropIT layers and lean activations); returns
    ``model``."""
    for module in model.modules():
        if is_converted(module):
            restore_layer(module)
    return model


def dropit_layers(model: nn.Module) -> dict[str, nn.Module]:
    """The DropIT layers of ``model`` by qualified name."""
    return {name: module for name, module in model.named_modules() if is_dropit_layer(module)}


def set_gamma_scale(model: nn.Module, scale: float) -> None:
    """Set every DropIT layer's gamma to ``scale`` times its configured gamma (a warm-up
    schedule uses 0 -> 1)."""
    for module in dropit_layers(model).values():
        module.dropit.gamma = module.dropit.base_gamma * scale


def keep_ratio(model: nn.Module, reset: bool = False) -> float | None:
    """Share of saved-input elements kept by all DropIT layers since their counters were reset
    (``None`` if none ran); ``reset=True`` restarts the counters."""
    states = [module.dropit for module in dropit_layers(model).values()]
    totals = [state.totals() for state in states]
    kept, seen = sum(kept for kept, _ in totals), sum(seen for _, seen in totals)
    if reset:
        for state in states:
            state.reset_counters()
    return kept / seen if seen else None
