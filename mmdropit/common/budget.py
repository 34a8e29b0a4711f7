"""Memory budgets as users write them: ``None``, a fraction of a measured baseline, or a size.

Every technique that takes a budget (checkpoint plans, micro-batching) parses it here, once, with
its own sentence saying what its baseline is, and resolves it to bytes once the baseline is
measured.

Example:
    >>> what = 'a budget is a fraction such as 0.5 or a size such as 4GB'
    >>> [parse_budget(b, what) for b in (None, 0.5, "4GB", "512 MiB")]
    [None, 0.5, 4000000000, 536870912]
    >>> resolve_budget(0.5, baseline_bytes=1000), resolve_budget(300, baseline_bytes=1000)
    (500, 300)
    >>> parse_budget('0GB', what)  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    mmdropit.errors.ConfigError: ...; a size must be above zero bytes, got '0GB'
"""
from __future__ import annotations

import re

from ..errors import ConfigError

Budget = float | int | None
"""``None`` (the least memory), a fraction in ``(0, 1]`` of a measured baseline (float), or a
number of bytes (int)."""

_UNITS = {'': 1, 'B': 1, 'KB': 10**3, 'MB': 10**6, 'GB': 10**9, 'TB': 10**12,
          'KIB': 2**10, 'MIB': 2**20, 'GIB': 2**30, 'TIB': 2**40}
_SIZE = re.compile(r'^\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*$')


def parse_budget(budget: object, what: str) -> Budget:
    """Check ``budget`` and return it as ``None``, a fraction (float) or bytes (int).

    Args:
        budget: The value from the user.
        what: What a valid budget is for the caller, for the error message, e.g. ``"a
            checkpoint budget is None, a fraction of the unplanned activation peak such as 0.5,
            or a size such as '4GB'"``.

    Raises:
        ConfigError: If it is none of those (e.g. ``'half'``, ``0``, ``1.5``, ``'4 parsecs'``).
    """
    if budget is None:
        return None
    if isinstance(budget, bool):
        raise ConfigError(f'{what}; got {budget!r}')
    if isinstance(budget, float):
        if not 0 < budget <= 1:
            raise ConfigError(f'{what}; a fraction must lie in (0, 1], got {budget!r}')
        return budget
    if isinstance(budget, int):
        if budget <= 0:
            raise ConfigError(f'{what}; a size must be above zero bytes, got {budget!r}')
        return budget
    if isinstance(budget, str):
        match = _SIZE.match(budget)
        unit = match.group(2).upper() if match else None
        if match and unit in _UNITS:
            size = int(float(match.group(1)) * _UNITS[unit])
            if size > 0:
                return size
            raise ConfigError(f'{what}; a size must be above zero bytes, got {budget!r}')
    raise ConfigError(f'{what}; got {budget!r}')


def resolve_budget(budget: Budget, baseline_bytes: int) -> int | None:
    """The budget in bytes (``None`` stays ``None``: least memory)."""
    if isinstance(budget, float):
        return int(budget * baseline_bytes)
    return budget
