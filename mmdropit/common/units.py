"""Byte counts as people read them.

Example:
    >>> mib(3 * 2**20), mib(2**19, digits=2), mib(2**20, unit=False)
    ('3.0 MiB', '0.50 MiB', '1.0')
    >>> mib(12345 * 2**20, unit=False, grouped=True)
    '12,345.0'
"""
from __future__ import annotations

MIB = 2**20
"""Bytes in a mebibyte."""


def mib(nbytes: float, digits: int = 1, unit: bool = True, grouped: bool = False) -> str:
    """``nbytes`` in MiB with ``digits`` decimals (thousands separated by commas if
    ``grouped``), followed by ``' MiB'`` unless ``unit`` is false (a table whose header names
    the unit)."""
    text = f'{nbytes / MIB:{"," if grouped else ""}.{digits}f}'
    return f'{text} MiB' if unit else text
