"""Files written whole or not at all.

:func:`atomic_write` writes to a temporary file beside the target (``.NAME.XXXX.partial``),
flushes it to disk and renames it over the target (``os.replace``, atomic on POSIX): a reader
finds the old file or the new one, never a part. A kill leaves at most a ``.partial`` file,
which no search for checkpoints or plans picks and which may be deleted. The file gets the
permissions a plain ``open`` would leave: the old file's where there was one, else those the
process's umask allows.

Example:
    >>> import os, tempfile
    >>> target = os.path.join(tempfile.mkdtemp(), 'last_checkpoint')
    >>> with atomic_write(target, 'w') as stream:
    ...     _ = stream.write('epoch_1.pth')
    >>> open(target).read(), os.listdir(os.path.dirname(target))
    ('epoch_1.pth', ['last_checkpoint'])
"""
from __future__ import annotations

import contextlib
import os
import os.path as osp
import secrets
import stat
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
    handle, partial = _create_beside(path, directory)
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


def _create_beside(path: str, directory: str) -> tuple[int, str]:
    """A new, empty file in ``directory`` named after ``path``, opened for writing: created
    with mode 0o666 less the umask (as ``open`` creates one; ``tempfile.mkstemp`` would make it
    0o600), then given the mode of ``path`` where that exists."""
    while True:
        partial = osp.join(directory, f'.{osp.basename(path)}.{secrets.token_hex(4)}.partial')
        try:
            handle = os.open(partial, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666)
            break
        except FileExistsError:
            continue
    with contextlib.suppress(OSError):  # no old file, or a file system without modes
        os.chmod(partial, stat.S_IMODE(os.stat(path).st_mode))
    return handle, partial
