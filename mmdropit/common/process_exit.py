"""End a distributed process without the gloo exit race, and with its launcher.

A gloo worker thread (``ProcessGroupGloo::runLoop``) drops its reference to a finished
collective after the caller's ``wait()`` returned. When that reference is the last one to a
tensor that has a Python object, the thread must take the GIL to release it. If the main thread
has meanwhile reached interpreter finalization, taking the GIL ends the worker thread through
a forced unwind, and libstdc++ aborts the process: "terminate called without an active
exception", SIGABRT, exit code -6, after a run that finished. ``destroy_process_group`` does not
help: the process group object stays alive as long as FSDP's device mesh holds it, and its
threads with it. (Seen on torch 2.13 with FSDP2 all-gathers, in about one run in five.)

:func:`end_distributed_process` therefore leaves the process group, runs the interpreter's
exit functions while it is fully alive (logging flushes its files, multiprocessing joins the
data loader workers), flushes stdout and stderr, and ends the process with ``os._exit``,
skipping the finalization in which the abort happens. Files written with ``with open(...)`` /
``torch.save`` are closed before it runs; a file left open by the caller is not flushed.

Example:
    The last line of a process started by ``torch.multiprocessing.spawn``::

        def work(rank, port):
            dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}',
                                    rank=rank, world_size=2)
            ...
            end_distributed_process()

:func:`end_with_launcher` makes a process that torchrun started end when torchrun ends, even by
``kill -9``: without it, the ranks are re-parented and train on to the last epoch.
"""
from __future__ import annotations

import atexit
import ctypes
import os
import signal
import sys
from typing import NoReturn

import torch.distributed as dist

PR_SET_PDEATHSIG = 1  # from <linux/prctl.h>


def end_distributed_process(status: int = 0) -> NoReturn:
    """Destroy the process group (if any) and end the process with exit code ``status``,
    skipping interpreter finalization (see the module docstring for why).

    Only for the end of a process: nothing after the call runs, not even the caller's
    ``finally`` blocks.
    """
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()
    atexit._run_exitfuncs()  # what a normal exit runs first, while the interpreter is alive
    for stream in (sys.stdout, sys.stderr):
        stream.flush()
    os._exit(status)


def end_with_launcher() -> None:
    """Have the kernel send this process SIGTERM when its parent, the launcher, ends (Linux's
    ``PR_SET_PDEATHSIG``; nothing elsewhere).

    The signal comes when the parent *thread* that started this process ends: torchrun starts
    its workers from its main thread, which lives as long as torchrun. A launcher that ended
    before the signal was set ends this process at once: the parent changed meanwhile, or the
    process ``MMDROPIT_LAUNCHER_PID`` names (``tools/dist_train.sh`` exports torchrun's pid, so
    a torchrun killed while this process was starting is seen too) has ended.

    Raises:
        SystemExit: The launcher has ended.
    """
    if not sys.platform.startswith('linux'):
        return
    parent = os.getppid()
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, int(signal.SIGTERM), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), 'prctl(PR_SET_PDEATHSIG) failed')
    launcher = int(os.environ.get('MMDROPIT_LAUNCHER_PID', parent))
    if os.getppid() != parent or not is_running(launcher):  # no signal will come
        sys.exit(f'error: the launcher of this process (pid {launcher}) has ended')


def is_running(pid: int) -> bool:
    """Whether process ``pid`` exists and has not ended (a zombie has)."""
    try:
        with open(f'/proc/{pid}/stat') as stream:
            return stream.read().rsplit(')', 1)[1].split()[0] != 'Z'
    except OSError:
        return False
