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
    ResNet stages ``layer1``..``layer4``, mmdet's ``ResLayer``), outermost first; a sequence of
    stages gives way to its stages' sequences of composite blocks, however short, where each
    stage is one (EfficientNet's and MobileNetV3's ``blocks.N``, whose blocks timm's
    ``set_grad_checkpointing()`` checkpoints one by one) or holds one or more as direct
    children with at least :data:`STAGE_SHARE` of its parameters (timm's Swin and ConvNeXt
    ``stages.N.blocks``, beside a small downsampling layer; not a CSPDarknet's, whose
    cross-stage convolutions hold more than a third).

    Example:
        >>> stage = lambda depth: nn.Sequential(*[nn.Sequential(nn.Linear(4, 4), nn.GELU())
        ...                                       for _ in range(depth)])
        >>> [name for name, _ in block_sequences(nn.Sequential(stage(1), stage(2)))]
        ['0', '1']
    """
    modules = dict(model.named_modules())

    def stages_of(name: str) -> list[str] | None:
        """The sequences of composite blocks each block of ``name`` is or holds (see above;
        ``None`` where a block has none)."""
        stages = []
        for child, block in modules[name].named_children():
            prefix = f'{name}.{child}' if name else child
            if _stage(block):
                stages.append(prefix)
                continue
            inner = [(f'{prefix}.{sub}', part) for sub, part in block.named_children()
                     if _stage(part)]
            if sum(_parameters(part) for _, part in inner) < STAGE_SHARE * _parameters(block):
                return None
            stages += [inner_name for inner_name, _ in inner]
        return stages

    def standing_for(name: str) -> list[str]:
        stages = stages_of(name)
        return [name] if stages is None else [one for stage in stages
                                              for one in standing_for(stage)]

    found = [name for name, module in modules.items() if _sequence(module, 2)]
    return [(name, modules[name]) for outer in found
            if not any(inside(outer, other) for other in found)
            for name in standing_for(outer)]


STAGE_SHARE = 2 / 3
"""The share of a stage's parameters its sequences of blocks hold at least, for
:func:`block_sequences` to take them instead of the stage (timm's Swin and ConvNeXt: 0.92-1.0
per stage; CSPDarknet-53: 0.34-0.75)."""


def _stage(module: nn.Module) -> bool:
    """Whether ``module`` is an ``nn.Sequential`` of one or more composite blocks of one
    class."""
    return _sequence(module, 1) and _blocks(list(module.children()), 1)


def _parameters(module: nn.Module) -> int:
    return sum(parameter.numel() for parameter in module.parameters())


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
