"""Which submodules get their own FSDP2 unit (``fully_shard``) before the root.

Each unit's parameters are gathered just before it runs and freed right after, so the peak holds
one unit unsharded at a time. The defaults give one unit per timm transformer block and per
ResNet stage; anything else is selected by class name or by qualified-module-name pattern.

Example config (the defaults)::

    model_wrapper_cfg = dict(
        type='FullyShardModelWrapper',
        shard_policy=dict(classes=['Block'], names=['layer[1-4]', '*.layer[1-4]']))
"""
from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass

from torch import nn

from ...errors import ConfigError

DEFAULT_CLASSES = ('Block',)
"""Class names sharded by default: ``timm.models.vision_transformer.Block`` (ViT, DeiT)."""
DEFAULT_NAMES = ('layer[1-4]', '*.layer[1-4]')
"""Module-name patterns sharded by default: the stages of mmdet / timm / torchvision ResNets."""


@dataclass(frozen=True)
class ShardPolicy:
    """Select the modules to shard on their own.

    A module is selected when a class of its MRO has one of ``classes`` as ``__name__`` (so a
    class that DropIT or FSDP derived from it still matches), or when its qualified name
    matches one of ``names`` (``fnmatch``). The root is always sharded last, by the caller.

    Args:
        classes: Class names, e.g. ``['Block', 'SwinTransformerBlock']``.
        names: Qualified-name patterns, e.g. ``['backbone.layer*', 'neck']``.
    """

    classes: Sequence[str] = DEFAULT_CLASSES
    names: Sequence[str] = DEFAULT_NAMES

    def __post_init__(self) -> None:
        for field in ('classes', 'names'):
            value = getattr(self, field)
            if isinstance(value, str) or not all(isinstance(v, str) for v in value):
                raise ConfigError(f'shard_policy {field} takes a list of strings, got {value!r}')

    def selects(self, name: str, module: nn.Module) -> bool:
        """Whether the module called ``name`` gets its own unit."""
        if any(cls.__name__ in self.classes for cls in type(module).__mro__):
            return True
        return any(fnmatch.fnmatchcase(name, pattern) for pattern in self.names)

    def units(self, model: nn.Module) -> list[tuple[str, nn.Module]]:
        """The selected proper submodules of ``model`` holding parameters, innermost first (the
        order ``fully_shard`` needs for nested units)."""
        selected = [(name, module) for name, module in model.named_modules()
                    if name and self.selects(name, module)
                    and next(module.parameters(), None) is not None]
        return selected[::-1]
