"""What DropIT's conversion of a model shares: which layers it leaves exact by default, what it
reports, and the way back (:func:`from_dropit`); :class:`~.config.DropITConfig` converts.

Layer names are qualified module names (``'blocks.0.mlp.fc1'``). A pattern selects a layer when it
equals the name, is a prefix of it at a dot (``'backbone.layer1'`` selects every layer inside), or
matches it as an ``fnmatch`` wildcard (``'*.qkv'``).

By default, as in the DropIT paper, the first layer (it sees the raw input) and the
classifier / box-predictor layers are left exact: a timm model's ``get_classifier()`` and the
layers matching :data:`PREDICTOR_PATTERNS` (mmdet's ``fc_cls``, ``fc_reg``, ``rpn_cls``, ...).

Example:
    >>> net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.ReLU(), nn.Conv2d(8, 8, 3), nn.ReLU(),
    ...                     nn.Flatten(), nn.Linear(128, 10))
    >>> default_exclude(net)  # the first layer (a plain Sequential names no classifier)
    ['0']
    >>> from_dropit(net) is net
    True
"""
from __future__ import annotations

import fnmatch
from collections.abc import Mapping
from dataclasses import dataclass, field

from torch import nn

from .layers import DROPIT_TYPES, is_converted, is_dropit_layer, restore_layer

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
