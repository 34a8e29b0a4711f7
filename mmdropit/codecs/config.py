"""Compressed activations' configuration (:class:`CompressionConfig`): checked once, applied in
one call.

``CompressActivationsHook``, the memory budget's quantized-activations switch, the benchmark and
:func:`compress_activations` all make one and call :meth:`~CompressionConfig.apply`.

Example:
    >>> from torch import nn
    >>> net = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.LayerNorm(256), nn.Linear(256, 8))
    >>> with CompressionConfig(bits=4).apply(net) as applied:
    ...     applied.converted, type(net[1]).__name__
    (['1', '2'], 'CompressedGELU')
    >>> type(net[1]).__name__
    'GELU'
    >>> CompressionConfig(types=['LayerNorm'], bits=8).to_json()
    {'bits': 8, 'types': ['LayerNorm'], 'names': None, 'lean_activations': False}
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import InitVar, dataclass
from typing import ClassVar

from torch import nn

from ..common.name_patterns import checked_list
from ..common.technique import Applied
from ..errors import ConfigError
from .activations import DEFAULT_TYPES, convert_modules, restore_activations
from .bits import check_bits


@dataclass(frozen=True)
class CompressionConfig:
    """What chosen modules save for backward, stored in ``bits`` bits (:mod:`.activations`).

    Args:
        bits: 8 (int8 with a float32 scale per 32 values), 4 or 2 (a float32 minimum and step
            per 32 values, stochastic rounding).
        types: Module classes, or class names, to convert (``None``: :data:`DEFAULT_TYPES`,
            normalisation layers, GELU, SiLU, Softmax and ``Attention`` modules).
        names: Name patterns of modules to convert instead of ``types``.
        lean_activations: GELU and SiLU modules save 4-bit codes of their derivative instead of
            their quantized input (0.125 of an fp32 input).
        where: Who gives the values, to start error messages with (not stored).

    Raises:
        ConfigError: Unsupported ``bits``, or ``types`` / ``names`` that are not lists.

    Config example::

        custom_hooks = [dict(type='CompressActivationsHook', bits=8)]
    """

    name: ClassVar[str] = 'quantize'
    lossy: ClassVar[bool] = True

    bits: int = 8
    types: tuple[type[nn.Module] | str, ...] | None = None
    names: tuple[str, ...] | None = None
    lean_activations: bool = False
    where: InitVar[str] = 'compressed activations'

    def __post_init__(self, where: str) -> None:
        check_bits(self.bits, f'{where} bits')
        lists = f"{where} types / names take a list, e.g. types=['LayerNorm', 'GELU']"
        object.__setattr__(self, 'types', checked_list(self.types, lists, (str, type)))
        object.__setattr__(self, 'names', checked_list(self.names, lists))
        if not isinstance(self.lean_activations, bool):
            raise ConfigError(f'{where} lean_activations takes True or False, '
                              f'got {self.lean_activations!r}')

    def apply(self, model: nn.Module) -> AppliedCompression:
        """Convert ``model``'s chosen modules in place (Parameters and ``state_dict`` keys
        unchanged; a module inside a converted one is not converted again).

        Raises:
            ConfigError: If no module matches.
        """
        types = DEFAULT_TYPES if self.types is None else self.types
        return AppliedCompression(model, convert_modules(model, self.bits, types, self.names,
                                                         self.lean_activations))

    def to_json(self) -> dict:
        types = None if self.types is None else [
            kind if isinstance(kind, str) else kind.__name__ for kind in self.types]
        return dict(bits=self.bits, types=types,
                    names=None if self.names is None else list(self.names),
                    lean_activations=self.lean_activations)


class AppliedCompression(Applied):
    """Compressed activations in effect on a model; :meth:`remove` restores every converted
    module (:func:`~.activations.restore_activations`).

    Attributes:
        converted: The names of the converted modules.
    """

    def __init__(self, model: nn.Module, converted: list[str]) -> None:
        super().__init__(lambda: restore_activations(model),
                         f'compressed activations in {len(converted)} modules')
        self.converted = converted


def compress_activations(model: nn.Module, bits: int = 8,
                         types: Sequence[type | str] = DEFAULT_TYPES,
                         names: Sequence[str] | None = None,
                         lean_activations: bool = False) -> list[str]:
    """Store what the chosen modules of ``model`` save for backward in ``bits`` bits, in place
    (``CompressionConfig(...).apply(model)``; the arguments are :class:`CompressionConfig`'s).

    Parameters, buffers and ``state_dict`` keys stay the same;
    :func:`~.activations.restore_activations` undoes it. A module inside a converted one is not
    converted again.

    Returns:
        The names of the converted modules.

    Raises:
        ConfigError: Unsupported ``bits``, or no module to convert.
    """
    return CompressionConfig(bits, types, names, lean_activations).apply(model).converted
