"""DropIT's configuration (:class:`DropITConfig`): checked once, applied to a model in one call.

The DropIT hook, the memory budget, the benchmark and the FSDP wrapper each make a
:class:`DropITConfig` and call :meth:`~DropITConfig.apply`; :func:`to_dropit` is the same call
for a model in hand.

Example:
    >>> from torch import nn
    >>> net = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 8), nn.ReLU(),
    ...                     nn.Linear(8, 2))
    >>> config = DropITConfig(gamma=0.8, exclude=['0', '4'])
    >>> with config.apply(net) as applied:
    ...     applied.report.layers, type(net[2]).__name__
    (['2'], 'DropITLinear')
    >>> type(net[2]).__name__
    'Linear'
    >>> DropITConfig(gamma={'*.fc2': 0.5}).to_json()['gamma']
    {'*.fc2': 0.5}
    >>> DropITConfig(gamma=1.5)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    mmdropit.errors.ConfigError: DropIT gamma must be a number in [0, 1) (...); got 1.5
"""
from __future__ import annotations

import warnings
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import InitVar, asdict, dataclass
from typing import ClassVar

from torch import nn

from ..common.name_patterns import checked_list, matches
from ..common.technique import Applied
from ..errors import ConfigError
from .convert import ConversionReport, Gamma, default_exclude, from_dropit
from .layers import DROPIT_TYPES, LEAN_ACTIVATION_TYPES, convert_activation, convert_layer
from .quantize import check_value_bits
from .state import DropITState
from .strategies import check_gamma, check_strategy


def _checked_gamma(gamma: object, where: str) -> float | tuple[tuple[str, float], ...]:
    """``gamma``, one value or ``{pattern: gamma}`` (kept as pairs, so that the configuration
    is hashable), checked."""
    if isinstance(gamma, Mapping):
        if not gamma:
            raise ConfigError(f'{where} mapping is empty: give {{pattern: gamma}}, '
                              'e.g. {"*": 0.9}')
        return tuple((str(pattern), check_gamma(value, f'{where} for {pattern!r}'))
                     for pattern, value in gamma.items())
    if isinstance(gamma, tuple) and all(isinstance(pair, tuple) for pair in gamma):
        return _checked_gamma(dict(gamma), where)
    return check_gamma(gamma, where)


@dataclass(frozen=True)
class DropITConfig:
    """DropIT on a model's Linear / Conv layers (:mod:`mmdropit.dropit`).

    Args:
        gamma: Share of each saved input to drop, in ``[0, 1)``; or ``{pattern: gamma}``, first
            matching pattern wins and layers matching none are left exact.
        strategy: ``'mink'`` (exact top-k), ``'mink_approx'`` (sampled threshold, faster) or
            ``'random'`` (unbiased random keep).
        layers: Patterns of the layers to convert; ``None`` for all supported layers.
        exclude: Patterns of layers to leave exact; ``None`` for the defaults (first layer and
            classifier / predictor heads); ``[]`` to exclude nothing.
        lean_activations: Also make every ReLU / ReLU6 / Hardtanh / LeakyReLU keep a 1-bit mask,
            so a layer after it really frees its dense input.
        value_bits: 8 stores the kept values as int8 with a float32 scale per 32 values
            (:mod:`.quantize`: 0.059 instead of 0.13 of an fp32 input at gamma 0.9), 4 or 2
            with a minimum and step per 32 values and stochastic rounding (0.050, 0.044);
            ``None`` keeps them in the input's dtype.
        where: Who gives the values, to start error messages with (not stored).

    Raises:
        ConfigError: For a gamma outside [0, 1), an unknown strategy, ``value_bits`` other than
            ``None`` / 8 / 4 / 2, or patterns that are not a list of strings.

    Config example::

        custom_hooks = [dict(type='DropITHook', gamma=0.9, exclude=['patch_embed.proj', 'head'])]
    """

    name: ClassVar[str] = 'dropit'
    lossy: ClassVar[bool] = True

    gamma: float | tuple[tuple[str, float], ...] = 0.9
    strategy: str = 'mink'
    layers: tuple[str, ...] | None = None
    exclude: tuple[str, ...] | None = None
    lean_activations: bool = True
    value_bits: int | None = None
    where: InitVar[str] = 'DropIT'

    def __post_init__(self, where: str) -> None:
        set_field = object.__setattr__  # frozen: the checked, normalised values are set once
        set_field(self, 'gamma', _checked_gamma(self.gamma, f'{where} gamma'))
        check_strategy(self.strategy)
        check_value_bits(self.value_bits, f'{where} value_bits')
        patterns = (f'{where} layers / exclude take a list of name patterns, '
                    "e.g. exclude=['patch_embed.proj', 'head']")
        set_field(self, 'layers', checked_list(self.layers, patterns))
        set_field(self, 'exclude', checked_list(self.exclude, patterns))
        if not isinstance(self.lean_activations, bool):
            raise ConfigError(f'{where} lean_activations takes True or False, '
                              f'got {self.lean_activations!r}')

    @property
    def gammas(self) -> Gamma:
        """``gamma`` as given: one value, or ``{pattern: gamma}``."""
        return dict(self.gamma) if isinstance(self.gamma, tuple) else self.gamma

    def apply(self, model: nn.Module) -> AppliedDropIT:
        """Convert ``model``'s layers in place.

        Raises:
            ConfigError: If no supported layer is left to convert.
        """
        return AppliedDropIT(model, _convert(model, self))

    def to_json(self) -> dict:
        return dict(asdict(self), gamma=self.gammas,
                    layers=None if self.layers is None else list(self.layers),
                    exclude=None if self.exclude is None else list(self.exclude))


class AppliedDropIT(Applied):
    """DropIT in effect on a model; :meth:`remove` converts every DropIT layer and lean
    activation back (:func:`~.convert.from_dropit`).

    Attributes:
        report: What was converted.
    """

    def __init__(self, model: nn.Module, report: ConversionReport) -> None:
        super().__init__(lambda: from_dropit(model), str(report))
        self.report = report


def _warn_unmatched(patterns: Iterable[str], names: Sequence[str], what: str) -> None:
    for pattern in patterns:
        if not any(matches(name, pattern) for name in names):
            shown = ', '.join(names[:40]) + (', ...' if len(names) > 40 else '')
            warnings.warn(f'DropIT {what} pattern {pattern!r} matches no supported layer; '
                          f'the supported layers are: {shown}', stacklevel=4)


def _gamma_for(name: str, gamma: Gamma) -> float | None:
    if isinstance(gamma, Mapping):
        for pattern, value in gamma.items():
            if matches(name, pattern):
                return value
        return None
    return gamma


def _convert(model: nn.Module, config: DropITConfig) -> ConversionReport:
    """Convert ``model``'s supported layers in place as ``config`` says (those ``layers``
    selects, but ``exclude`` or the defaults, and frozen ones), then its ReLU-family
    activations, and report what was converted.

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


def to_dropit(model: nn.Module, gamma: Gamma = 0.9, strategy: str = 'mink',
              layers: Sequence[str] | None = None, exclude: Sequence[str] | None = None,
              lean_activations: bool = True, value_bits: int | None = None) -> nn.Module:
    """Convert the Linear / Conv layers of ``model`` to DropIT layers, in place
    (``DropITConfig(...).apply(model)``; the arguments are :class:`DropITConfig`'s).

    Parameters, buffers and ``state_dict`` keys stay the same objects and names, so an optimizer
    built before the call keeps working and checkpoints load with or without DropIT.

    Returns:
        ``model``, converted (:func:`~.convert.from_dropit` undoes it).

    Raises:
        ConfigError: For a bad value (see :class:`DropITConfig`), or nothing to convert.

    Example:
        >>> import timm
        >>> from mmdropit.dropit import dropit_layers
        >>> vit = timm.create_model('vit_tiny_patch16_224', img_size=32, patch_size=8, depth=2)
        >>> vit = to_dropit(vit, gamma=0.9)
        >>> sorted(dropit_layers(vit))[:2]
        ['blocks.0.attn.proj', 'blocks.0.attn.qkv']
        >>> vit.patch_embed.proj in dropit_layers(vit).values()  # first layer stays exact
        False
    """
    DropITConfig(gamma, strategy, layers, exclude, lean_activations, value_bits).apply(model)
    return model

