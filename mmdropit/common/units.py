"""Byte counts as people read them.

Example:
    >>> mib(3 * 2**20), mib(2**19, digits=2), mib(2**20, unit=False)
    ('3.0 MiB', '0.50 MiB', '1.0')
"""
from __future__ import annotations

MIB = 2**20
"""Bytes in a mebibyte."""


def mib(nbytes: float, digits: int = 1, unit: bool = True) -> str:
    """``nbytes`` in MiB with ``digits`` decimals, followed by ``' MiB'`` unless ``unit`` is
    false (a table whose header names the unit)."""
    text = f'{nbytes / MIB:.{digits}f}'
    return f'{text} MiB' if unit else text
