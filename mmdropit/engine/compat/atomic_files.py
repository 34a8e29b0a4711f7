"""Checkpoints and ``last_checkpoint`` written whole or not at all.

MMEngine 0.10.7 writes a checkpoint with ``LocalBackend.put`` and ``last_checkpoint`` with the
builtin ``open``, both straight into the final file: a kill during the write leaves a truncated
``epoch_N.pth`` or an empty ``last_checkpoint`` where a whole one used to be. With this shim
both are written to a temporary file beside the target (``.NAME.XXXX.partial``), flushed to
disk, and renamed over the target (``os.replace``, atomic on POSIX): a reader finds the old
file or the new one, never a part. A kill leaves at most a ``.partial`` file, which no
checkpoint search picks (it does not end in ``.pth``) and which may be deleted.

Example:
    >>> import os, tempfile
    >>> target = os.path.join(tempfile.mkdtemp(), 'last_checkpoint')
    >>> with atomic_write(target, 'w') as stream:
    ...     _ = stream.write('epoch_1.pth')
    >>> open(target).read(), os.listdir(os.path.dirname(target))
    ('epoch_1.pth', ['last_checkpoint'])
"""
from __future__ import annotations

import builtins
import contextlib
import os
import os.path as osp
import tempfile
from collections.abc import Iterator
from typing import IO


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = 'wb',
                 encoding: str | None = None) -> Iterator[IO]:
    """Open a temporary file beside ``path`` for writing; on a clean exit from the block it
    is flushed to disk and renamed to ``path``; on an exception it is removed and ``path`` is
    left as it was."""
    path = os.fspath(path)
    directory = osp.dirname(path) or '.'
    os.makedirs(directory, exist_ok=True)
    handle, partial = tempfile.mkstemp(dir=directory, prefix=f'.{osp.basename(path)}.',
                                       suffix='.partial')
    try:
        with os.fdopen(handle, mode, encoding=encoding) as stream:
            yield stream
            stream.flush()
            os.fsync(stream.fileno())
        os.replace(partial, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.remove(partial)
        raise


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
