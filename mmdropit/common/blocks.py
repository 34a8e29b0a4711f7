"""The repeated blocks of a model: what hand-made checkpointing and activation offload work on
(the lists of blocks, :func:`block_lists`, only where a recorded step shows them chained:
:func:`mmdropit.checkpoint.chain.repeated_blocks`, which the per-block plan and activation
offload's default choice take; the benchmark's hand-made baselines take the sequences alone).

Example:
    >>> from torch import nn
    >>> net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)))
    >>> [name for name, _ in block_sequences(net)]
    ['1']
    >>> stages = nn.ModuleList(nn.Module() for _ in range(2))
    >>> for stage in stages:
    ...     stage.blocks = nn.ModuleList(nn.Sequential(nn.Linear(4, 4), nn.GELU())
    ...                                  for _ in range(3))
    >>> [name for name, _ in block_lists(stages)]
    ['', '0.blocks', '1.blocks']
"""
from __future__ import annotations

from torch import nn


def block_sequences(model: nn.Module) -> list[tuple[str, nn.Sequential]]:
    """The ``nn.Sequential`` modules made of two or more blocks of one class (timm's ``blocks``,
    ResNet stages ``layer1``..``layer4``, mmdet's ``ResLayer``), outermost first: a sequence
    whose blocks each hold such sequences gives way to those (timm's Swin and ConvNeXt
    ``stages.N.blocks``, not the ``stages``; EfficientNet's ``blocks``, whose one-block stages
    hold none, stays whole): the blocks that timm's ``set_grad_checkpointing()`` checkpoints.

    Example:
        >>> stage = lambda: nn.Sequential(nn.Sequential(nn.Linear(4, 4), nn.GELU()),
        ...                               nn.Sequential(nn.Linear(4, 4), nn.GELU()))
        >>> [name for name, _ in block_sequences(nn.Sequential(stage(), stage()))]
        ['0', '1']
    """
    found = {name: module for name, module in model.named_modules()
             if isinstance(module, nn.Sequential) and len(module) >= 2
             and len({type(child) for child in module.children()}) == 1
             and any(True for _ in module[0].parameters())}

    def standing_for(name: str) -> list[str]:
        within = [other for other in found if inside(other, name)]
        below = [other for other in within if not any(inside(other, mid) for mid in within)]
        blocks = [f'{name}.{child}' if name else child for child, _ in found[name].named_children()]
        if below and all(any(other == block or inside(other, block) for other in below)
                         for block in blocks):
            return [inner for other in below for inner in standing_for(other)]
        return [name]

    outermost = [name for name in found if not any(inside(name, other) for other in found)]
    return [(name, found[name]) for outer in outermost for name in standing_for(outer)]


def block_lists(model: nn.Module) -> list[tuple[str, nn.ModuleList]]:
    """The ``nn.ModuleList`` modules made of two or more blocks of one class, each with
    parameters and modules of its own, neither inside nor around a :func:`block_sequences` one
    (mmdet's Swin ``stages`` and ``stages.0.blocks``). They are blocks only where the parent
    calls them one after another, each on what the one before returned, which a recorded step
    tells (:func:`mmdropit.checkpoint.build_chain` checks it and takes the innermost of those
    that pass): an FPN's lateral convolutions are such a list too, each called on a feature map
    of its own."""
    sequences = [name for name, _ in block_sequences(model)]
    return [(name, module) for name, module in model.named_modules()
            if isinstance(module, nn.ModuleList) and _blocks(list(module.children()))
            and not any(inside(name, outer) or inside(outer, name) for outer in sequences)]


def _blocks(children: list[nn.Module]) -> bool:
    """Whether ``children`` are two or more modules of one class, each with parameters and
    modules of its own."""
    return (len(children) >= 2 and len({type(child) for child in children}) == 1
            and all(any(True for _ in child.parameters()) and any(True for _ in child.children())
                    for child in children))


def innermost(names: list[str]) -> list[str]:
    """Those of ``names`` (modules) that hold none of the others.

    Example:
        >>> innermost(['stages', 'stages.0.blocks', 'stages.1.blocks', 'neck'])
        ['stages.0.blocks', 'stages.1.blocks', 'neck']
    """
    return [name for name in names if not any(inside(other, name) for other in names)]


def inside(name: str, outer: str) -> bool:
    """Whether the module ``name`` is inside the module ``outer`` (``''``: the model)."""
    return name != outer and (not outer or name.startswith(f'{outer}.'))
