"""Offload what chosen modules of a model save for backward to host memory, in place, and
choose the modules that hold a given share of a step's saved bytes.

:func:`offload_activations` hooks each chosen module so that its forward pass runs inside a group
of a :class:`~mmdropit.common.host_copies.HostCopies` (``method='prefetch'``: side-stream copies,
prefetched one group ahead in backward) or inside PyTorch's
``torch.autograd.graph.save_on_cpu(pin_memory=True)`` (``method='save_on_cpu'``, the baseline).
Inside a region that a checkpoint recomputes the modules step aside: the checkpoint already drops
what they save. So inside a model's own ``torch.utils.checkpoint``: a non-reentrant one's (timm's
``set_grad_checkpointing()``) first pass and recomputation, where their hooks, the innermost, kept
(or copied to the host) what the checkpoint drops, and a reentrant one's recomputation (mmdet's
``with_cp=True``), which runs inside the backward pass. :func:`restore_offload` removes the hooks.

:func:`modules_holding_share` picks, from a recorded forward pass, the earliest modules among
the candidates until they saved ``share`` of the step's bytes: the tensors saved first wait
longest for backward, so their copies have the most time to travel.

Example:
    >>> from torch import nn
    >>> net = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 8))
    >>> offload = offload_activations(net, ['0', '1'])
    >>> net(torch.randn(32, 64)).sum().backward()   # on CPU: nothing moves
    >>> offload.names, offload.copies.stats.bytes_moved
    (['0', '1'], 0)
    >>> restore_offload(net)
    ['0', '1']
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

from ..checkpoint.chain import repeated_blocks
from ..checkpoint.record import record_step
from ..checkpoint.step_record import StepRecord
from ..common.blocks import block_sequences
from ..common.host_copies import HostCopies
from ..common.name_patterns import matches
from ..common.recompute_region import saved_until_backward
from ..errors import ConfigError

METHODS = ('prefetch', 'save_on_cpu')
"""``prefetch``: :class:`~mmdropit.common.host_copies.HostCopies`; ``save_on_cpu``: PyTorch's
own."""
_ATTRIBUTE = '_mmdropit_offload'


@dataclass
class Offload:
    """The offload put on a model.

    Attributes:
        names: The offloaded modules.
        method: One of :data:`METHODS`.
        copies: Where ``prefetch`` keeps its copies and statistics.
    """

    names: list[str]
    method: str
    copies: HostCopies = field(default_factory=HostCopies)
    _handles: list = field(default_factory=list, repr=False)

    def context(self) -> contextlib.AbstractContextManager:
        """The context one call of an offloaded module runs in."""
        if not saved_until_backward():
            return contextlib.nullcontext()
        if self.method == 'save_on_cpu':
            return torch.autograd.graph.save_on_cpu(pin_memory=torch.cuda.is_available())
        return self.copies.group()


def _enter(offload: Offload, stack: list) -> Callable:
    def pre_hook(module: nn.Module, args: tuple) -> None:
        context = offload.context()
        context.__enter__()
        stack.append(context)
    return pre_hook


def _leave(stack: list) -> Callable:
    def post_hook(module: nn.Module, args: tuple, output: object) -> None:
        stack.pop().__exit__(None, None, None)
    return post_hook


def offload_activations(model: nn.Module, names: Sequence[str],
                        method: str = 'prefetch') -> Offload:
    """Keep what the modules ``names`` of ``model`` save for backward in host memory.

    Args:
        model: Any ``nn.Module`` (on a GPU; on CPU nothing moves).
        names: Name patterns (exact, a prefix at a dot, or ``fnmatch`` wildcards) of the
            modules to offload; a module inside a chosen one is covered by it.
        method: ``'prefetch'`` or ``'save_on_cpu'`` (:data:`METHODS`).

    Returns:
        The :class:`Offload` (its ``copies.stats`` count what moved).

    Raises:
        ConfigError: An unknown method, no module matching ``names``, or a model offloaded
            already.
    """
    if method not in METHODS:
        raise ConfigError(f'offload method {method!r}: use one of {", ".join(METHODS)}')
    if getattr(model, _ATTRIBUTE, None) is not None:
        raise ConfigError('the model is offloaded already: restore_offload(model) first')
    chosen: list[str] = []
    for name, _ in model.named_modules():
        if name and any(matches(name, pattern) for pattern in names) and not any(
                name.startswith(outer + '.') for outer in chosen):
            chosen.append(name)
    if not chosen:
        raise ConfigError(f'activation offload found no module of {type(model).__name__} '
                          f'matching {list(names)}')
    offload = Offload(chosen, method)
    for name in chosen:
        module, stack = model.get_submodule(name), []
        offload._handles += [module.register_forward_pre_hook(_enter(offload, stack)),
                             module.register_forward_hook(_leave(stack), always_call=True)]
    setattr(model, _ATTRIBUTE, offload)
    return offload


def restore_offload(model: nn.Module) -> list[str]:
    """Undo :func:`offload_activations`; return the names that were offloaded."""
    offload = getattr(model, _ATTRIBUTE, None)
    if offload is None:
        return []
    for handle in offload._handles:
        handle.remove()
    delattr(model, _ATTRIBUTE)
    return offload.names


def block_patterns(model: nn.Module, record: StepRecord | None = None) -> list[str]:
    """Name patterns of the blocks of the model's block sequences (``['blocks.*']`` for a timm
    ViT, ``['layer1.*', ..., 'layer4.*']`` for a ResNet) and, given a recorded step of it, of
    its lists of blocks that the step called one after another (mmdet's Swin
    ``backbone.stages.N.blocks.*``, DETR's layers;
    :func:`~mmdropit.checkpoint.chain.repeated_blocks`): where :func:`modules_holding_share`
    chooses by default.

    Example:
        >>> block_patterns(nn.Sequential(nn.Sequential(nn.Linear(4, 4), nn.ReLU()),
        ...                              nn.Sequential(nn.Linear(4, 4), nn.ReLU())))
        ['*']
    """
    names = (repeated_blocks(record, model) if record is not None
             else [name for name, _ in block_sequences(model)])
    return [f'{name}.*' if name else '*' for name in names]


def modules_holding_share(model: nn.Module, forward: Callable[[], object],
                          candidates: Sequence[str] | None, share: float,
                          link_bytes_per_second: float = math.inf) -> list[str]:
    """The earliest ``candidates`` (name patterns) of ``model``, in forward order, whose saved
    bytes reach ``share`` of what one forward pass saves, or the bytes the host link moves in
    the forward pass's time, whichever is less (at least the first candidate).

    Args:
        model: The model.
        forward: Runs one training forward pass (``lambda: model(x).sum()``).
        candidates: Name patterns of the modules to choose from (``['blocks.*']``); the
            outermost matching calls count. ``None``: the blocks of the model's repeated blocks
            in the recorded pass (:func:`block_patterns`), or for a model without them, its
            outermost modules (``['*']``).
        share: The share of the step's saved bytes to reach, in ``(0, 1]``.
        link_bytes_per_second: How fast the host link copies (:mod:`.link`); more than it
            moves while the forward pass runs would come out of the step's time.

    Raises:
        ConfigError: ``share`` outside ``(0, 1]`` or no call matching ``candidates``.
    """
    if not 0 < share <= 1:
        raise ConfigError(f'offload share must be in (0, 1], got {share!r}')
    record = record_step(model, forward)
    if candidates is None:
        candidates = block_patterns(model, record) or ['*']
    total = record.saved_bytes
    share = min(share, link_bytes_per_second * record.calls[0].seconds / max(total, 1))
    names = {name for name, _ in model.named_modules() if name}
    chosen: list[str] = []
    held: set[int] = set()
    for call in record.calls:
        if call.name not in names or not any(matches(call.name, p) for p in candidates) or any(
                call.name.startswith(outer + '.') for outer in chosen):
            continue
        if held and sum(record.storage_bytes[sid] for sid in held) >= share * total:
            break
        chosen.append(call.name)
        held |= record.saves_in(call.index)
    if not chosen:
        raise ConfigError(f'no module of {type(model).__name__} matches {list(candidates)}')
    return chosen
