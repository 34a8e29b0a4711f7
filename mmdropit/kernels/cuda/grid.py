"""Launch-grid arithmetic on the host, in plain Python.

Triton's ``triton.cdiv`` and ``triton.next_power_of_2`` are ``constexpr_function`` objects in
recent Triton releases (3.7 here): callable from kernels and from the host, but a host call
unwraps its arguments first, ~3.5 us each on this CPU. A DropIT selection computed its grids
with eight such calls, most of its Python time without the launches (37 us of ~40 at 64
elements): paid every layer of a host-bound GPU step.

Example:
    >>> ceil_div(4097, 4096), next_power_of_2(33), next_power_of_2(1)
    (2, 64, 1)
"""
from __future__ import annotations


def ceil_div(numerator: int, denominator: int) -> int:
    """``numerator / denominator`` rounded up, for non-negative integers."""
    return -(-numerator // denominator)


def next_power_of_2(value: int) -> int:
    """The smallest power of two at least ``value`` (1 for ``value`` <= 1)."""
    return 1 << max(value - 1, 0).bit_length()
