"""Checkpoints and ``last_checkpoint`` written whole or not at all.

MMEngine 0.10.7 writes a checkpoint with ``LocalBackend.put`` and ``last_checkpoint`` with the
builtin ``open``, both straight into the final file: a kill during the write leaves a truncated
``epoch_N.pth`` or an empty ``last_checkpoint`` where a whole one used to be. With this shim
both go through :func:`~mmdropit.common.files.atomic_write`: a reader finds the old file or
the new one, never a part, and a kill leaves at most a ``.partial`` file, which no checkpoint
search picks (it does not end in ``.pth``). With ``max_keep_ckpts``, ``CheckpointHook`` removes
the oldest checkpoint before it writes the new one: the removal waits until the new checkpoint
and ``last_checkpoint`` are written, so that a kill in between leaves one to resume from.
"""
from __future__ import annotations

import builtins
import functools
from collections.abc import Callable

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


def _removing_after_saving(save: Callable) -> Callable:
    """``CheckpointHook._save_checkpoint_with_step`` with the removals it makes of old
    checkpoints held back until it has returned (not made where it raised)."""
    @functools.wraps(save)
    def save_then_remove(self, runner, step, meta) -> None:
        backend = self.file_backend
        held: list[tuple[str, object]] = []
        backend.remove = lambda path: held.append(('remove', path))
        backend.rmtree = lambda path: held.append(('rmtree', path))
        try:
            save(self, runner, step, meta)
        finally:
            del backend.remove, backend.rmtree
        for method, path in held:
            getattr(backend, method)(path)

    save_then_remove.removes_after_saving = True
    return save_then_remove


def install() -> None:
    """Route MMEngine's local file writes and ``CheckpointHook``'s ``last_checkpoint`` through
    :func:`atomic_write`, and its removal of old checkpoints after the new one (once)."""
    from mmengine.fileio.backends import local_backend
    from mmengine.hooks import checkpoint_hook

    backend = local_backend.LocalBackend
    backend.put, backend.put_text = _put, _put_text
    checkpoint_hook.open = _open_writing_atomically  # a module global shadows the builtin
    hook = checkpoint_hook.CheckpointHook
    if not getattr(hook._save_checkpoint_with_step, 'removes_after_saving', False):
        hook._save_checkpoint_with_step = _removing_after_saving(hook._save_checkpoint_with_step)
