"""Checkpoints and ``last_checkpoint`` written whole or not at all.

MMEngine 0.10.7 writes a checkpoint with ``LocalBackend.put`` and ``last_checkpoint`` with the
builtin ``open``, both straight into the final file: a kill during the write leaves a truncated
``epoch_N.pth`` or an empty ``last_checkpoint`` where a whole one used to be. With this shim
both go through :func:`~mmdropit.common.files.atomic_write`: a reader finds the old file or
the new one, never a part, and a kill leaves at most a ``.partial`` file, which no checkpoint
search picks (it does not end in ``.pth``).
"""
from __future__ import annotations

import builtins

from ...common.files import atomic_write


def _put(self, obj: bytes, filepath) -> None:
    with atomic_write(filepath, 'wb') as stream:
        stream.write(obj)


def _put_text(self, obj: str, filepath, encoding: str = 'utf-8') -> None:
    with atomic_write(filepath, 'w', encoding=encoding) as stream:
        stream.write(obj)


def _open_writing_atomically(file, mode: str = 'r', *args, **kwargs):
    """The builtin ``open``, except that writing a whole file goes through
    :func:`atomic_write` (for ``CheckpointHook``'s ``last_checkpoint``)."""
    if mode in ('w', 'wt', 'wb') and not args:
        return atomic_write(file, mode, encoding=kwargs.get('encoding'))
    return builtins.open(file, mode, *args, **kwargs)


def install() -> None:
    """Route MMEngine's local file writes and ``CheckpointHook``'s ``last_checkpoint`` through
    :func:`atomic_write`."""
    from mmengine.fileio.backends import local_backend
    from mmengine.hooks import checkpoint_hook

    backend = local_backend.LocalBackend
    backend.put, backend.put_text = _put, _put_text
    checkpoint_hook.open = _open_writing_atomically  # a module global shadows the builtin
