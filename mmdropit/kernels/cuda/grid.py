"""Launch-grid arithmetic on the host, in plain Python.

Triton's ``triton.cdiv`` and ``triton.next_power_of_2`` are ``constexpr_function`` objects in
recent Triton releases: callable from kernels and from the host, but a host call unwraps its
arguments first, microseconds each, and a selection's launches need several a layer, every step
(docs/dropit.md, "Host cost").

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
