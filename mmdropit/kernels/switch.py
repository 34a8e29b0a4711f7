"""The switch between DropIT's fused kernels and its eager path, for every device.

Setting ``MMDROPIT_FUSED=0``, or :func:`eager_only` around a step, keeps DropIT on the eager
PyTorch path (side-by-side comparisons in one process, or ruling the kernels out).

Example:
    >>> with eager_only():
    ...     fused_enabled()
    False
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

_eager_only = False


@contextlib.contextmanager
def eager_only() -> Iterator[None]:
    """Keep DropIT on its eager path inside (a side-by-side comparison in one process)."""
    global _eager_only
    before, _eager_only = _eager_only, True
    try:
        yield
    finally:
        _eager_only = before


def fused_enabled() -> bool:
    """False inside :func:`eager_only` and when ``MMDROPIT_FUSED=0`` asks for the eager path."""
    return not _eager_only and os.environ.get('MMDROPIT_FUSED', '1') != '0'
