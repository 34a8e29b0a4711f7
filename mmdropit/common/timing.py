"""The wall time of some work on a device: on a GPU the queue is drained before and after, so
the time is that of the work, not of the launches alone.

Example:
    >>> seconds_of(lambda: torch.ones(8).sum(), torch.device('cpu')) >= 0
    True
"""
from __future__ import annotations

import time
from collections.abc import Callable

import torch


def seconds_of(run: Callable[[], object], device: torch.device) -> float:
    """Seconds ``run()`` takes on ``device`` (a CUDA device is synchronised around it)."""
    cuda = device.type == 'cuda'
    if cuda:
        torch.cuda.synchronize(device)
    started = time.perf_counter()
    run()
    if cuda:
        torch.cuda.synchronize(device)
    return time.perf_counter() - started
