"""The DropIT settings and counters that a converted layer carries."""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field
from typing import Any

import torch


@dataclass
class DropITState:
    """What one DropIT layer drops, and what it has dropped so far.

    Attributes:
        name: The layer's qualified name in the converted model (for messages and audits).
        gamma: Share of the saved input dropped now (``base_gamma`` times the schedule factor).
        base_gamma: The configured gamma.
        strategy: ``'mink'``, ``'mink_approx'`` or ``'random'``.
        value_bits: 8, 4 or 2 to keep the kept values as integer codes per group, ``None``
            to keep them in the input's dtype.
        kept_elements: Elements kept by eager steps since the counters were last reset.
        seen_elements: Elements those steps saw.
        counters: Elements kept and seen by compiled steps, as a tensor on the device of the
            layer's inputs (``None``: made at the next compiled count). A compiled graph adds
            to it in place, where reading and writing an int attribute would make
            ``torch.compile`` guard on its value and recompile every step; an eager step adds
            to the ints instead, where the tensor would cost a GPU step four kernel launches a
            layer (host time, on a host-bound step).
        dense_warned: Whether the "kept dense" warning was given.
        save_plan: How the last input was saved (:class:`~.ops.SavePlan`: count kept,
            encoding, layout), reused while inputs keep their shape, dtype and device and
            gamma and strategy stay the same (``None`` before the first).

    Example:
        >>> state = DropITState('blocks.0.mlp.fc1', gamma=0.9, base_gamma=0.9, strategy='mink')
        >>> state.count(kept=10, seen=100, device=torch.device('cpu')); state.keep_ratio
        0.1
    """

    name: str
    gamma: float
    base_gamma: float
    strategy: str
    value_bits: int | None = None
    kept_elements: int = field(default=0, repr=False)
    seen_elements: int = field(default=0, repr=False)
    counters: torch.Tensor | None = field(default=None, repr=False)
    dense_warned: bool = field(default=False, repr=False)
    save_plan: Any = field(default=None, repr=False, compare=False)

    def totals(self) -> tuple[int, int]:
        """Elements kept and seen since the counters were last reset, eager and compiled
        steps together (reads the compiled steps' tensor: a GPU sync)."""
        kept, seen = self.kept_elements, self.seen_elements
        if self.counters is not None:
            compiled_kept, compiled_seen = self.counters.tolist()
            kept, seen = kept + compiled_kept, seen + compiled_seen
        return kept, seen

    @property
    def keep_ratio(self) -> float | None:
        """Realised share of kept elements since the last reset (``None`` before any step)."""
        kept, seen = self.totals()
        return kept / seen if seen else None

    def count(self, kept: int, seen: int, device: torch.device) -> None:
        """Add one saved input to the counters (while compiled, to the tensor on ``device``)."""
        if not torch.compiler.is_compiling():
            self.kept_elements += kept
            self.seen_elements += seen
            return
        if self.counters is None or self.counters.device != device:
            self.counters = torch.zeros(2, dtype=torch.int64, device=device)
        self.counters[0] += kept
        self.counters[1] += seen

    def reset_counters(self, device: torch.device | None = None) -> None:
        """Start counting afresh (e.g. at each logged iteration): zero the counters in place,
        and make the compiled steps' tensor on ``device`` when given."""
        self.kept_elements = self.seen_elements = 0
        if device is not None:
            self.counters = torch.zeros(2, dtype=torch.int64, device=device)
            # a fixed address: CUDA graphs (compile's reduce-overhead) replay a graph that adds
            # to it in place; an input mutated at a moving address would make them skip it
            torch._dynamo.mark_static_address(self.counters)
        elif self.counters is not None:
            self.counters.zero_()

    def warn_dense_once(self, dtype_name: str) -> None:
        """Say once that this layer keeps its input dense because compact would not be smaller."""
        if not self.dense_warned:
            self.dense_warned = True
            warnings.warn(
                f'DropIT layer {self.name!r}: at gamma {self.gamma:g} a compact {dtype_name} '
                'input would not be smaller than the dense one, so the layer keeps its input '
                'dense (exact gradient, no saving). Use gamma >= 0.07 to save memory.',
                stacklevel=4)
