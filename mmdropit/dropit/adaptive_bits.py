"""Adaptive bits (GACT's idea): give each place that stores integer codes the bit width its
gradient error deserves, within the bytes that one bit width everywhere would take.

A *slot* is a DropIT layer whose kept values are stored as codes (``value_bits``) or a module
converted by :func:`~mmdropit.codecs.compress_activations`. Each step, each slot adds an error
to the parameters' gradient; GACT (Liu et al., ICML 2022) showed that those errors differ by
orders of magnitude between layers, so a uniform width spends bits where they buy nothing. Here
the *sensitivity* of a slot is measured on one real step: the squared distance between the
gradient with that slot alone in :data:`PROBE_BITS` bits and the gradient with every slot exact
(dense activations, DropIT's kept values in their dtype; DropIT's own selection stays), as a
share of the exact gradient's squared norm. Stochastic rounding errs by a multiple of the step,
``range / (2**bits - 1)``, so the error at ``bits`` is taken as the probe's times
``((2**PROBE_BITS - 1) / (2**bits - 1))**2`` (int8's nearest rounding errs less than that: the
model over-counts it, which only makes 8 bits look less useful). Errors of different slots are
added, as independent rounding makes them.

:func:`adapt_bits` then chooses the widths (8, 4 or 2) with the least summed error whose codes
take no more than the configured widths' bytes (:func:`~mmdropit.codecs.quantized_values_bytes`, group
parameters included). It costs one step per slot plus two; the training state (parameters'
gradients, buffers, RNG streams) is left as it was. The bits chosen hold until it runs again
(``CompressActivationsHook(adaptive_bits=True)`` runs it on the first batch, and every
``adapt_interval`` iterations if set).

Failure modes: the measurement is one batch's; a slot that stores nothing in that batch (a
branch not taken, a compressed module inside a selective checkpoint, where it steps aside) or
that no gradient passes through keeps its configured width. Inside a plain checkpoint a slot is
counted when the recomputation stores its codes. Distributed ranks that run it on their own
batches may choose differently; the hook broadcasts rank 0's choice.

Example:
    >>> from torch import nn
    >>> from mmdropit.codecs import compress_activations
    >>> from mmdropit.dropit import to_dropit
    >>> _ = torch.manual_seed(0)
    >>> net = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.LayerNorm(256), nn.Linear(256, 8))
    >>> net = to_dropit(net, gamma=0.5, value_bits=4, lean_activations=False)
    >>> _ = compress_activations(net, bits=4)
    >>> x = torch.randn(128, 64)
    >>> allocation = adapt_bits(net, lambda: net(x).square().mean())
    >>> sorted(slot.name for slot in allocation.slots)
    ['1', '2', '3']
    >>> allocation.bytes <= allocation.budget_bytes, allocation.error <= allocation.error_before
    (True, True)
"""
from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
from torch import nn

from ..codecs.activations import CompressedActivations, Compression, observe_compression
from ..codecs.bits import BITS, quantized_values_bytes
from ..common.recompute_region import saved_tensors_dropped
from ..common.training_state import preserved_training_state
from ..common.units import mib
from ..errors import ConfigError
from .compact import CompactLayout
from .functional import observe_saves
from .state import DropITState

PROBE_BITS = 2
"""The width each slot is measured at (the coarsest: its error stands out of the noise)."""
NO_GRADIENT = 1e-9
"""A slot whose measured error is below this share adds nothing to this step's gradient (a
residual branch whose last norm starts at zero, a frozen layer): it keeps its configured width,
since one step cannot say what it will add later."""
_BYTE_UNITS = 4096
"""The allocation's knapsack counts bytes in this many units of the budget."""


@dataclass(frozen=True)
class BitsSlot:
    """One place that stores codes, as measured and as chosen.

    Attributes:
        name: The module's qualified name.
        kind: ``'dropit values'`` (a DropIT layer's kept values) or ``'activations'`` (what a
            compressed module saves).
        values: Values it stored as codes in the measured step.
        error: Squared gradient error with it alone in :data:`PROBE_BITS` bits, as a share of
            the exact gradient's squared norm.
        configured_bits: Its width before the allocation.
        bits: The width chosen.
    """

    name: str
    kind: str
    values: int
    error: float
    configured_bits: int
    bits: int

    @property
    def measured(self) -> bool:
        """Whether the step measured an error for it (values stored, gradient through it);
        a slot that was not keeps its configured width."""
        return self.values > 0 and self.error >= NO_GRADIENT

    def error_at(self, bits: int) -> float:
        """The modelled gradient error (same unit as :attr:`error`) at ``bits``."""
        return self.error * ((2 ** PROBE_BITS - 1) / (2 ** bits - 1)) ** 2

    def bytes_at(self, bits: int) -> int:
        """Bytes of its codes at ``bits``."""
        return quantized_values_bytes(self.values, bits) if self.values else 0


@dataclass(frozen=True)
class BitsAllocation:
    """What :func:`adapt_bits` measured and chose.

    Attributes:
        slots: Every slot, in the model's module order.
        budget_bytes: Bytes of the codes at the widths it found, in the step measured.
        bytes: Bytes of the codes at the chosen widths.
        error_before: Modelled gradient error at the widths it found (sum over slots).
        error: Modelled gradient error at the chosen widths.
    """

    slots: tuple[BitsSlot, ...]
    budget_bytes: int
    bytes: int
    error_before: float
    error: float

    @property
    def chosen(self) -> dict[str, int]:
        """The chosen width of each slot, by name (what :func:`set_bits` takes)."""
        return {slot.name: slot.bits for slot in self.slots}

    def table(self) -> str:
        """The allocation as a text table, one slot a row, with the totals last."""
        rows = [f'{"slot":<40} {"kind":<13} {"values":>10} {"error at 2b":>11} {"bits":>9}']
        for slot in self.slots:
            rows.append(f'{slot.name:<40} {slot.kind:<13} {slot.values:>10} '
                        f'{slot.error:>11.3g} {slot.configured_bits:>3} -> {slot.bits:<3}'
                        + ('' if slot.measured else ' (no gradient through it: kept)'))
        rows.append(f'codes {mib(self.bytes, 2)} (configured {mib(self.budget_bytes, 2)}); '
                    f'modelled gradient error {self.error:.3g} '
                    f'(configured {self.error_before:.3g})')
        return '\n'.join(rows)


class _Slot:
    """Reads and sets one slot's width (``None``: exact)."""

    def __init__(self, name: str, module: nn.Module) -> None:
        self.name, self.module = name, module
        self.kind = 'activations' if isinstance(module, CompressedActivations) else \
            'dropit values'
        self.configured = self.bits

    @property
    def settings(self) -> Compression | DropITState:
        """The object the module reads its width from (what the save observers are given)."""
        return self.module.compression if self.kind == 'activations' else self.module.dropit

    @property
    def bits(self) -> int | None:
        if self.kind == 'activations':
            return self.module.compression.bits
        return self.module.dropit.value_bits

    @bits.setter
    def bits(self, bits: int | None) -> None:
        if self.kind == 'activations':
            self.module.compression = dataclasses.replace(self.module.compression, bits=bits)
        else:
            self.module.dropit.value_bits = bits


def _slots(model: nn.Module) -> list[_Slot]:
    """DropIT layers with ``value_bits`` and compressed modules (not lean derivative ones)."""
    slots = []
    for name, module in model.named_modules():
        state = getattr(module, 'dropit', None)
        if isinstance(state, DropITState) and state.value_bits is not None:
            slots.append(_Slot(name, module))
        elif (isinstance(module, CompressedActivations)
              and module.compression.derivative is None):
            slots.append(_Slot(name, module))
    return slots


@contextlib.contextmanager
def _values_counted(slots: list[_Slot]) -> Iterator[dict[str, int]]:
    """Count, per slot name, the values stored as codes while the block runs (inside a plain
    checkpoint: by its recomputation)."""
    counts = dict.fromkeys((slot.name for slot in slots), 0)
    names = {id(slot.settings): slot.name for slot in slots}

    def activation_saved(compression: Compression, dense: torch.Tensor, _: int) -> None:
        if id(compression) in names:
            counts[names[id(compression)]] += dense.numel()

    def dropit_saved(state: DropITState, _: torch.Tensor, layout: CompactLayout) -> None:
        if id(state) in names and not saved_tensors_dropped():  # not a checkpoint's first pass
            counts[names[id(state)]] += layout.value_count

    with observe_compression(activation_saved), observe_saves(dropit_saved):
        yield counts


def _gradient(model: nn.Module, step: Callable[[], torch.Tensor]) -> list[torch.Tensor]:
    """The parameters' gradient of one step, drawn with the RNG streams as they are now."""
    parameters = [p for p in model.parameters() if p.requires_grad]
    for parameter in parameters:
        parameter.grad = None
    with preserved_training_state(model):
        step().backward()
    return [torch.zeros_like(p) if p.grad is None else p.grad.detach().clone()
            for p in parameters]


def _distance(gradient: list[torch.Tensor], exact: list[torch.Tensor]) -> float:
    return float(sum((g - e).double().square().sum() for g, e in zip(gradient, exact)))


def _allocate(slots: list[BitsSlot], budget_bytes: int) -> list[BitsSlot]:
    """The widths of measured ``slots`` with the least modelled error whose bytes fit
    ``budget_bytes``: a knapsack solved exactly on bytes rounded up to :data:`_BYTE_UNITS`
    units of the budget; the configured widths (which fit by definition) where the rounding
    made that choice worse."""
    widths = sorted(BITS)
    unit = max(budget_bytes / _BYTE_UNITS, 1.0)
    least = torch.zeros(int(budget_bytes // unit) + 1, dtype=torch.float64)  # by units spent
    choices = []
    for slot in slots:
        options = torch.full((len(widths), least.numel()), float('inf'), dtype=torch.float64)
        for row, bits in enumerate(widths):
            cost = math.ceil(slot.bytes_at(bits) / unit)
            if cost < least.numel():
                options[row, cost:] = least[:least.numel() - cost] + slot.error_at(bits)
        least, choice = options.min(dim=0)
        choices.append(choice)
    units = int(least.argmin())
    chosen = []
    for slot, choice in zip(reversed(slots), reversed(choices)):
        bits = widths[int(choice[units])]
        units -= math.ceil(slot.bytes_at(bits) / unit)
        chosen.append(dataclasses.replace(slot, bits=bits))
    chosen.reverse()
    configured = sum(slot.error_at(slot.configured_bits) for slot in slots)
    if not math.isfinite(float(least.min())) or \
            sum(slot.error_at(slot.bits) for slot in chosen) > configured:
        return [dataclasses.replace(slot, bits=slot.configured_bits) for slot in slots]
    return chosen


def set_bits(model: nn.Module, bits: dict[str, int]) -> None:
    """Set the widths of the named slots (another rank's :attr:`BitsAllocation.chosen`).

    Raises:
        ConfigError: A name that is not a slot of ``model``.
    """
    slots = {slot.name: slot for slot in _slots(model)}
    for name, width in bits.items():
        if name not in slots:
            raise ConfigError(f'adaptive bits: {name!r} is not a DropIT layer with value_bits '
                              f'or a compressed module of {type(model).__name__}')
        slots[name].bits = width


def adapt_bits(model: nn.Module, step: Callable[[], torch.Tensor]) -> BitsAllocation:
    """Measure each slot's gradient error on ``step`` and set its bits (in place) to the
    widths that add the least error within the bytes of the configured widths.

    Args:
        model: A model with DropIT layers storing ``value_bits`` and / or modules converted by
            :func:`~mmdropit.codecs.compress_activations` (lean derivative modules are left
            alone).
        step: Runs the model's forward pass on one batch and returns the loss (the closure
            :func:`mmdropit.plan_checkpoints` takes); called once per slot plus twice.

    Returns:
        The measurement and the choice (:meth:`BitsAllocation.table` prints it).

    Raises:
        ConfigError: The model has no slot.
    """
    slots = _slots(model)
    if not slots:
        raise ConfigError(f'adaptive bits found nothing stored as codes in '
                          f'{type(model).__name__}: convert it with compress_activations or '
                          f'DropIT value_bits first')
    saved_grads = [(p, p.grad) for p in model.parameters()]
    try:
        with _values_counted(slots) as values:
            _gradient(model, step)  # at the configured widths: what each slot stores
        for slot in slots:
            slot.bits = None
        exact = _gradient(model, step)
        norm = max(float(sum(g.double().square().sum() for g in exact)), 1e-30)
        measured = []
        for slot in slots:
            slot.bits = PROBE_BITS
            error = _distance(_gradient(model, step), exact) / norm if values[slot.name] else 0.0
            slot.bits = None
            measured.append(BitsSlot(slot.name, slot.kind, values[slot.name], error,
                                     slot.configured, slot.configured))
    finally:
        for slot in slots:
            slot.bits = slot.configured
        for parameter, grad in saved_grads:
            parameter.grad = grad
    budget = sum(slot.bytes_at(slot.configured_bits) for slot in measured)
    free = [slot for slot in measured if slot.measured]
    kept = sum(slot.bytes_at(slot.configured_bits) for slot in measured if not slot.measured)
    choice = {slot.name: slot for slot in _allocate(free, budget - kept)} if free else {}
    chosen = [choice.get(slot.name, slot) for slot in measured]
    for slot, choice in zip(slots, chosen):
        slot.bits = choice.bits
    return BitsAllocation(tuple(chosen), budget, sum(s.bytes_at(s.bits) for s in chosen),
                          sum(s.error_at(s.configured_bits) for s in measured),
                          sum(s.error_at(s.bits) for s in chosen))
