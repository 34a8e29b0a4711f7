"""The radix select's histograms, kept zeroed between ``keep_topk`` calls
(:func:`zeroed_histograms`), so that no call spends a launch on zeroing them.

A workspace is cached per thread, device and (on a GPU) current stream, allocated zeroed once: a
``keep_topk`` call fills it with its histogram passes (and a count of the last pass's finished
programs, which the last of them sets back to zero), and its write kernel, which reads the threshold
the last pass worked out and never the histograms, zeroes them again (after their last reader, that
pass, on the same stream), so the next call on that stream finds zeros. The key keeps apart what
could interleave: calls on other streams (which may run concurrently) and calls from other threads
(which may enqueue on the same stream between another call's launches). Under CUDA graph capture a
call gets a fresh zeroed tensor, not the cached one: the zeroing is captured with the passes (no
host cost on replay, where the graph is one launch), the graph owns its workspace at a fixed
address, shared with no eager call nor other graph, and nothing cached waits for a zeroing that only
a replay would run. A call that fails after filling it gives it back with :func:`forget`: the next
one allocates zeros again.

Example:
    >>> hist = zeroed_histograms(torch.device('cpu'), 1024)
    >>> hist is zeroed_histograms(torch.device('cpu'), 1024), int(hist.count_nonzero())
    (True, 0)
"""
from __future__ import annotations

import threading

import torch

_CACHED = threading.local()
"""Per thread, ``.workspaces``: the cached histograms by device (and CUDA stream)."""


def zeroed_histograms(device: torch.device, ints: int) -> torch.Tensor:
    """``ints`` int32 zeros on ``device``: the cached workspace of this thread, device and
    current CUDA stream (allocated the first time), or, under CUDA graph capture, a new one."""
    if device.type == 'cuda':
        if torch.cuda.is_current_stream_capturing():
            return torch.zeros(ints, dtype=torch.int32, device=device)
        key = (device, torch.cuda.current_stream(device).cuda_stream, ints)
    else:  # Triton's interpreter on CPU tensors (the tests)
        key = (device, ints)
    workspaces = getattr(_CACHED, 'workspaces', None)
    if workspaces is None:
        workspaces = _CACHED.workspaces = {}
    hist = workspaces.get(key)
    if hist is None:
        hist = workspaces[key] = torch.zeros(ints, dtype=torch.int32, device=device)
    return hist


def forget(hist: torch.Tensor) -> None:
    """Stop caching ``hist`` (left filled by a call that failed), if it is cached."""
    workspaces = getattr(_CACHED, 'workspaces', {})
    for key in [key for key, cached in workspaces.items() if cached is hist]:
        del workspaces[key]
