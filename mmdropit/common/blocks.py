"""The repeated blocks of a model: what hand-made checkpointing and activation offload work on.

Example:
    >>> from torch import nn
    >>> net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)))
    >>> [name for name, _ in block_sequences(net)]
    ['1']
"""
from __future__ import annotations

from torch import nn


def block_sequences(model: nn.Module) -> list[tuple[str, nn.Sequential]]:
    """The outermost ``nn.Sequential`` modules made of two or more blocks of one class (timm's
    ``blocks``, ResNet stages ``layer1``..``layer4``, mmdet's ``ResLayer``)."""
    found: list[tuple[str, nn.Sequential]] = []
    for name, module in model.named_modules():
        children = list(module.children())
        if (isinstance(module, nn.Sequential) and len(children) >= 2
                and len({type(child) for child in children}) == 1
                and any(True for _ in children[0].parameters())
                and not any(name.startswith(f'{outer}.') for outer, _ in found)):
            found.append((name, module))
    return found
