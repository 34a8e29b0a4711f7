"""A test-only hook that kills its own process (SIGKILL, as ``kill -9``) at a chosen point."""
from __future__ import annotations

import os
import os.path as osp
import signal

from mmengine.hooks import Hook
from mmengine.registry import HOOKS


def _kill() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


@HOOKS.register_module()
class KillHook(Hook):
    """Kill the training process with SIGKILL.

    Args:
        after_iter: Kill after this training iteration (1-based) has finished.
        while_writing: Kill while the file with this base name (e.g. ``'epoch_2.pth'`` or
            ``'last_checkpoint'``) is being written: when its bytes are written and it is
            being flushed to disk, before it replaces the old file.
        writes: Kill while it is written for this many times (1: the first time).
    """

    priority = 'VERY_LOW'

    def __init__(self, after_iter: int | None = None, while_writing: str | None = None,
                 writes: int = 1) -> None:
        self.after_iter = after_iter
        if while_writing is not None:
            flush_to_disk = os.fsync
            seen = []

            def fsync_or_die(handle: int) -> None:
                name = osp.basename(os.readlink(f'/proc/self/fd/{handle}'))
                if name.startswith(f'.{while_writing}.'):
                    seen.append(name)
                    if len(seen) == writes:
                        _kill()
                flush_to_disk(handle)

            os.fsync = fsync_or_die

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None) -> None:
        if runner.iter + 1 == self.after_iter:
            _kill()
