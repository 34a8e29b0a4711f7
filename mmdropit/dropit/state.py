"""The DropIT settings and counters that a converted layer carries."""
from __future__ import annotations

import warnings
from dataclasses import dataclass, field


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
        kept: Elements kept since the counters were last reset.
        seen: Elements seen since the counters were last reset.
        dense_warned: Whether the "kept dense" warning was given.

    Example:
        >>> state = DropITState('blocks.0.mlp.fc1', gamma=0.9, base_gamma=0.9, strategy='mink')
        >>> state.count(kept=10, seen=100); state.keep_ratio
        0.1
    """

    name: str
    gamma: float
    base_gamma: float
    strategy: str
    value_bits: int | None = None
    kept: int = 0
    seen: int = 0
    dense_warned: bool = field(default=False, repr=False)

    @property
    def keep_ratio(self) -> float | None:
        """Realised share of kept elements since the last reset (``None`` before any step)."""
        return self.kept / self.seen if self.seen else None

    def count(self, kept: int, seen: int) -> None:
        """Add one saved input to the counters."""
        self.kept += kept
        self.seen += seen

    def reset_counters(self) -> None:
        """Start counting afresh (e.g. at each logged iteration)."""
        self.kept = self.seen = 0

    def warn_dense_once(self, dtype_name: str) -> None:
        """Say once that this layer keeps its input dense because compact would not be smaller."""
        if not self.dense_warned:
            self.dense_warned = True
            warnings.warn(
                f'DropIT layer {self.name!r}: at gamma {self.gamma:g} a compact {dtype_name} '
                'input would not be smaller than the dense one, so the layer keeps its input '
                'dense (exact gradient, no saving). Use gamma >= 0.07 to save memory.',
                stacklevel=4)
