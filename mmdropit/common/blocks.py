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
    ResNet stages ``layer1``..``layer4``, mmdet's ``ResLayer``), outermost first, where a
    sequence whose blocks each are or hold sequences of composite blocks gives way to those,
    however short (timm's Swin and ConvNeXt ``stages.N.blocks``, EfficientNet's
    ``blocks.N``, some of one block): the blocks timm's ``set_grad_checkpointing()``
    checkpoints one by one.

    Example:
        >>> stage = lambda depth: nn.Sequential(*[nn.Sequential(nn.Linear(4, 4), nn.GELU())
        ...                                       for _ in range(depth)])
        >>> [name for name, _ in block_sequences(nn.Sequential(stage(1), stage(2)))]
        ['0', '1']
    """
    modules = dict(model.named_modules())

    def stages_of(name: str) -> list[str] | None:
        """The outermost sequences of composite blocks each block of ``name`` is or holds
        (``None`` where a block has none)."""
        found = []
        for child, block in modules[name].named_children():
            prefix = f'{name}.{child}' if name else child
            inner = [inner for inner, module in block.named_modules(prefix=prefix)
                     if _sequence(module, 1) and _blocks(list(module.children()), 1)]
            if not inner:
                return None
            found += [one for one in inner if not any(inside(one, other) for other in inner)]
        return found

    def standing_for(name: str) -> list[str]:
        stages = stages_of(name)
        return [name] if stages is None else [one for stage in stages
                                              for one in standing_for(stage)]

    found = [name for name, module in modules.items() if _sequence(module, 2)]
    return [(name, modules[name]) for outer in found
            if not any(inside(outer, other) for other in found)
            for name in standing_for(outer)]


def _sequence(module: nn.Module, least: int) -> bool:
    """Whether ``module`` is an ``nn.Sequential`` of ``least`` or more modules of one class, the
    first with parameters."""
    return (isinstance(module, nn.Sequential) and len(module) >= least
            and len({type(child) for child in module.children()}) == 1
            and any(True for _ in module[0].parameters()))


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


def _blocks(children: list[nn.Module], least: int = 2) -> bool:
    """Whether ``children`` are ``least`` or more modules of one class, each with parameters
    and modules of its own."""
    return (len(children) >= least and len({type(child) for child in children}) == 1
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
