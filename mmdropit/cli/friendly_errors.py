"""Turn the errors users hit most into one line that says what to do.

Used by ``tools/train.py`` and ``tools/test.py``: the first thing a user sees is
``error: ...``, not a traceback from deep inside a library (``--debug`` shows it).
"""
from __future__ import annotations

import re

from ..errors import MMDropITError

_NOT_IN_REGISTRY = re.compile(r'`?(\S+?)`? is not in the (\S+) registry')


def explain(exc: BaseException) -> str | None:
    """A one-line explanation of ``exc``, or ``None`` when it is not a known user error."""
    message = str(exc.args[0]) if isinstance(exc, KeyError) and exc.args else str(exc)
    first_line = message.strip().splitlines()[0] if message.strip() else type(exc).__name__
    if isinstance(exc, MMDropITError):
        return first_line
    match = _NOT_IN_REGISTRY.search(message)
    if isinstance(exc, KeyError) and match:
        name, registry = match.groups()
        return (f'unknown type {name!r} in the config ({registry} registry): check the '
                'spelling, or add the module that registers it to custom_imports')
    if isinstance(exc, TypeError) and 'unexpected keyword argument' in message:
        return f'{first_line} -- a config key is misspelt or does not belong there'
    if isinstance(exc, FileNotFoundError):
        return (f'{first_line} -- check data_root / ann_file / load_from in the config or '
                'override them with --cfg-options')
    return None
