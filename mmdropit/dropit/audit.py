"""Audit: does each DropIT layer (and each compressed activation) really free its dense input,
and if not, which op keeps it?

A DropIT layer saves a compact copy of its input, a module converted by
:func:`~mmdropit.codecs.compress_activations` saves integer codes of its saved tensors; memory
is freed only if nothing else keeps the dense tensor alive. After the forward pass of one real
step, the audit checks for every such save whether the dense tensor's storage still exists and,
if so, which autograd nodes saved it (e.g. ``GeluBackward0``: a GELU before the layer, or
``NativeBatchNormBackward0``: a norm that reads the same tensor). Those are the places where a
lean activation, compressing one more module, or excluding the layer would help.

The step's forward runs with gradients enabled, but no backward pass is taken and the model's
buffers (e.g. BatchNorm running statistics) are restored afterwards.

Example:
    >>> from mmdropit.dropit import to_dropit
    >>> net = to_dropit(nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 64),
    ...                               nn.ReLU(), nn.Linear(64, 8)), exclude=['0'])
    >>> x = torch.randn(16, 32)
    >>> report = audit(net, lambda: net(x).sum())
    >>> [(row.name, row.kept_by) for row in report.rows]
    [('2', ['TanhBackward0.result']), ('4', [])]
    >>> from mmdropit.codecs import compress_activations
    >>> net = nn.Sequential(nn.Linear(32, 256), nn.Tanh(), nn.LayerNorm(256), nn.GELU(),
    ...                     nn.Linear(256, 8))
    >>> compress_activations(net)
    ['2', '3']
    >>> report = audit(net, lambda: net(x).sum())
    >>> [(row.name, row.encoding, row.freed, row.kept_by) for row in report.rows]
    [('2', '8-bit', False, ['TanhBackward0.result']), ('3', '8-bit', True, [])]
"""
from __future__ import annotations

import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from ..codecs.activations import Compression, observe_compression
from ..common.training_state import values_restored
from ..common.units import mib
from .compact import CompactLayout
from .functional import observe_saves
from .state import DropITState


@dataclass
class LayerAudit:
    """One DropIT layer's (or compressed module's) saving in the audited step.

    Attributes:
        name: Qualified layer name.
        dense_bytes: Bytes of the dense input (a DropIT layer's: its whole storage; a saved
            tensor of a compressed module: its own elements).
        compact_bytes: Bytes the layer saved for backward.
        encoding: ``'bitmask'``, ``'indices'`` or ``'dense'`` (DropIT), ``'8-bit'``,
            ``'4-bit'``, ``'2-bit'`` or ``'4-bit derivative'`` (a compressed module's saved
            tensor).
        freed: Whether the dense input was freed after the forward pass.
        kept_by: Autograd nodes (``Node.saved_name``) that still hold the dense input; empty
            when it was freed or is held outside autograd (``held_outside``).
        held_outside: The dense input is alive but no autograd node holds it (a model input,
            or a tensor the model's code keeps).
    """

    name: str
    dense_bytes: int
    compact_bytes: int
    encoding: str
    freed: bool
    kept_by: list[str] = field(default_factory=list)
    held_outside: bool = False

    @property
    def freed_bytes(self) -> int:
        """Bytes this layer really saved (negative when the dense input stays anyway)."""
        return (self.dense_bytes if self.freed else 0) - self.compact_bytes


@dataclass
class AuditReport:
    """Per-save results of :func:`audit`, in forward order."""

    rows: list[LayerAudit]

    @property
    def freed_bytes(self) -> int:
        """Bytes freed by all DropIT layers together."""
        return sum(row.freed_bytes for row in self.rows)

    def __str__(self) -> str:
        lines = ['| layer | stored as | dense MiB | compact MiB | freed MiB '
                 '| dense input kept by |', '|---|---|---:|---:|---:|---|']
        for row in self.rows:
            keeper = ('-' if row.freed else ', '.join(row.kept_by)
                      or 'held outside autograd (model input or kept by the code)')
            lines.append(f'| {row.name} | {row.encoding} | {mib(row.dense_bytes, 2, unit=False)} | '
                         f'{mib(row.compact_bytes, 2, unit=False)} | '
                         f'{mib(row.freed_bytes, 2, unit=False)} | '
                         f'{keeper} |')
        kept = sum(not row.freed for row in self.rows)
        lines.append(f'\n{len(self.rows)} saves (DropIT layers, compressed activations) freed '
                     f'{mib(self.freed_bytes, 2)}; {kept} left their dense input alive.')
        return '\n'.join(lines)


@dataclass(frozen=True)
class _Save:
    """One save seen during the audited forward pass."""

    name: str
    encoding: str
    storage_key: tuple[str, int]
    storage: weakref.ref
    dense_bytes: int
    compact_bytes: int


def _storage_key(tensor: torch.Tensor) -> tuple[str, int]:
    storage = tensor.untyped_storage()
    return str(tensor.device), storage.data_ptr()


def _saved_by_nodes(root: torch.autograd.graph.Node | None) -> dict[tuple[str, int], list[str]]:
    """Storage -> ``'NodeName.saved_name'`` for every tensor saved in the graph under ``root``."""
    holders: dict[tuple[str, int], list[str]] = {}
    seen: set[int] = set()
    stack = [root] if root is not None else []
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        stack.extend(next_node for next_node, _ in node.next_functions)
        for attr in dir(node):
            if not attr.startswith('_saved_'):
                continue
            try:
                value = getattr(node, attr)
            except RuntimeError:  # freed or not a tensor
                continue
            values = value if isinstance(value, (tuple, list)) else (value,)
            for tensor in values:
                if isinstance(tensor, torch.Tensor) and tensor.device.type != 'meta':
                    label = f'{node.name()}.{attr.removeprefix("_saved_")}'
                    holders.setdefault(_storage_key(tensor), []).append(label)
    return holders


def audit(model: nn.Module, step: Callable[[], torch.Tensor]) -> AuditReport:
    """Run ``step`` (a forward pass returning a tensor, e.g. the loss) and audit every DropIT call
    and every tensor a compressed module stored as codes.

    Args:
        model: A model converted with :func:`~mmdropit.dropit.to_dropit` and / or
            :func:`~mmdropit.codecs.compress_activations`.
        step: Runs the forward pass of one training step and returns its output.

    Returns:
        An :class:`AuditReport` with one row per save (a layer called twice has two).
    """
    records: list[_Save] = []

    def observe(state: DropITState, dense: torch.Tensor, layout: CompactLayout) -> None:
        storage = dense.untyped_storage()
        records.append(_Save(state.name, layout.encoding, _storage_key(dense),
                             weakref.ref(storage), storage.nbytes(), layout.nbytes))

    def observe_codes(compression: Compression, dense: torch.Tensor, code_bytes: int) -> None:
        records.append(_Save(compression.name, compression.label, _storage_key(dense),
                             weakref.ref(dense.untyped_storage()),
                             dense.numel() * dense.element_size(), code_bytes))

    was_training = model.training
    model.train()
    try:
        with values_restored(model.buffers()), torch.enable_grad(), observe_saves(observe), \
                observe_compression(observe_codes):
            output = step()
        holders = _saved_by_nodes(output.grad_fn)
        rows = []
        for save in records:
            alive = save.storage() is not None
            kept_by = holders.get(save.storage_key, []) if alive else []
            rows.append(LayerAudit(save.name, save.dense_bytes, save.compact_bytes, save.encoding,
                                   freed=not alive, kept_by=kept_by,
                                   held_outside=alive and not kept_by))
        del output
    finally:
        model.train(was_training)
    return AuditReport(rows)
