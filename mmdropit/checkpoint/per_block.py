"""The per-block plan: every block of a model's repeated blocks checkpointed (its block
sequences, and its lists of blocks the step calls one after another), as timm's
``set_grad_checkpointing()`` and MMEngine's ``activation_checkpointing`` do, predicted on a
recorded step so that searched plans can be compared with it.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from .chain import build_chain
    >>> from .record import record_step
    >>> net = nn.Sequential(nn.Linear(8, 8), nn.Sequential(
    ...     *[nn.Sequential(nn.Linear(8, 8), nn.GELU()) for _ in range(4)]), nn.Linear(8, 1))
    >>> x = torch.randn(16, 8)
    >>> plan = per_block_plan(build_chain(record_step(net, lambda: net(x).sum()), net), net)
    >>> [target.where for target in plan.targets]
    ['1.0', '1.1', '1.2', '1.3']
    >>> _ = net[0].requires_grad_(False), net[1][0].requires_grad_(False)  # a frozen stage
    >>> plan = per_block_plan(build_chain(record_step(net, lambda: net(x).sum()), net), net)
    >>> [target.where for target in plan.targets]
    ['1.1', '1.2', '1.3']
    >>> own_checkpointing(net)
    []
"""
from __future__ import annotations

from torch import nn

from .chain import Chain, Segment
from .cost import predict
from .plan import CheckpointPlan
from .targets import ModuleTarget


def per_block_plan(chain: Chain, model: nn.Module) -> CheckpointPlan | None:
    """The plan that checkpoints each block of ``model``'s block sequences and lists
    (:attr:`~.chain.Chain.blocks`) that runs with gradients, predicted on ``chain`` (recorded on
    ``model``). A block of a frozen stage (no input or parameter that requires grad, as the first
    stage of MMDetection's detectors) is left out, as OpenMMLab's ``with_cp`` leaves it: there is
    nothing for backward to recompute. A sequence or list with a block that cannot be one of
    the chain's segments (called more than once, an input changed in place later, the step's
    last call) is left out whole.

    Returns:
        The plan; ``None`` when no block is left.
    """
    calls = chain.record.calls
    called = {call.name for call in calls}
    frozen = called - {call.name for call in calls if call.needs_grad}
    modules = dict(model.named_modules())
    targets: list[ModuleTarget] = []
    segments: list[Segment] = []
    for name in chain.blocks:
        blocks = [ModuleTarget(f'{name}.{index}' if name else str(index))
                  for index in range(len(modules[name]))]
        blocks = [target for target in blocks if target.module not in frozen]
        found = chain.segments_of(blocks)
        if found is not None:
            targets += blocks
            segments += found
    if not targets:
        return None
    return CheckpointPlan(targets, baseline=predict(chain, []), planned=predict(chain, segments),
                          forward_seconds=calls[0].seconds)


OWN_SWITCHES = ('grad_checkpointing', 'with_cp')
"""The attributes by which models checkpoint their own blocks: timm's
(``set_grad_checkpointing()``) and OpenMMLab backbones' (``with_cp=True``)."""


def own_checkpointing(model: nn.Module) -> list[str]:
    """The modules of ``model`` that checkpoint their own blocks, as ``'name.switch'`` (a
    :data:`OWN_SWITCHES` attribute set true; ``''`` names the model itself)."""
    return [f'{name}.{switch}' if name else switch for name, module in model.named_modules()
            for switch in OWN_SWITCHES if getattr(module, switch, False) is True]
