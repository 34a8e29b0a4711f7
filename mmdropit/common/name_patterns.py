"""Which module names a user's pattern selects (DropIT's ``layers`` / ``exclude``, compressed
activations' ``names``, activation offload's ``names``), and a list of them checked."""
from __future__ import annotations

import fnmatch
from collections.abc import Iterable

from ..errors import ConfigError


def matches(name: str, pattern: str) -> bool:
    """Whether ``pattern`` selects the module called ``name``: the exact name, a prefix at a
    dot, or ``fnmatch`` wildcards.

    Example:
        >>> matches('backbone.layer1.0.conv1', 'backbone.layer1'), matches('head', '*.head')
        (True, False)
    """
    return (name == pattern or name.startswith(pattern + '.')
            or fnmatch.fnmatchcase(name, pattern))


def checked_list(values: Iterable | None, error: str,
                 kinds: tuple[type, ...] = (str,)) -> tuple | None:
    """``values`` (``None`` stays ``None``) as a tuple, when it is a list of ``kinds`` (name
    patterns by default) and not one string.

    Example:
        >>> checked_list(['head', '*.qkv'], 'layers take a list')
        ('head', '*.qkv')
        >>> checked_list('head', 'layers take a list')
        Traceback (most recent call last):
        ...
        mmdropit.errors.ConfigError: layers take a list

    Raises:
        ConfigError: With ``error`` as its message, for anything else.
    """
    if values is None:
        return None
    if isinstance(values, str) or not isinstance(values, Iterable) or not all(
            isinstance(value, kinds) for value in values):
        raise ConfigError(error)
    return tuple(values)
