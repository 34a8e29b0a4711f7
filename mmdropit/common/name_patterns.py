"""Which module names a user's pattern selects (DropIT's ``layers`` / ``exclude``, compressed
activations' ``names``)."""
from __future__ import annotations

import fnmatch


def matches(name: str, pattern: str) -> bool:
    """Whether ``pattern`` selects the module called ``name``: the exact name, a prefix at a
    dot, or ``fnmatch`` wildcards.

    Example:
        >>> matches('backbone.layer1.0.conv1', 'backbone.layer1'), matches('head', '*.head')
        (True, False)
    """
    return (name == pattern or name.startswith(pattern + '.')
            or fnmatch.fnmatchcase(name, pattern))
