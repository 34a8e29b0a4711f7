"""How DropIT stored a saved input (:class:`CompactLayout`): with the saved tensors, enough to
rebuild it densely (:mod:`.compact` encodes and decodes, :mod:`.quantize` codes the values)."""
from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class CompactLayout:
    """How a saved input was encoded; with the saved tensors, enough to rebuild it densely.

    Attributes:
        shape: Shape of the original tensor.
        dtype: Its dtype (the values' dtype).
        encoding: ``'bitmask'``, ``'indices'`` or ``'dense'``.
        memory_order: Permutation from the tensor's dimensions to its memory order
            (``None`` for a contiguous tensor; ``(0, 2, 3, 1)`` for channels_last).
        nbytes: Bytes of the saved tensors.
        value_bits: 8, 4 or 2 when the kept values are stored as integer codes per group
            (:mod:`.quantize`), ``None`` when in ``dtype``.
        value_count: How many values the codes hold (with ``value_bits``).
    """

    shape: torch.Size
    dtype: torch.dtype
    encoding: str
    memory_order: tuple[int, ...] | None
    nbytes: int
    value_bits: int | None = None
    value_count: int = 0
