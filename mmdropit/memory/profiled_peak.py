"""The growth of allocated memory over a region, from the allocator's own reports: a meter that
works under ``torch.compile``.

:class:`StepPeakMeter` on CPU is a dispatch mode (MemTracker); it sees the tensors the dispatcher
creates, and a compiled step run under it is traced with the mode in place, so it measures a
different program. Every allocation and free of PyTorch's CPU allocator, whoever asks for it
(eager operators, inductor's generated code, autograd), is also reported to the profiler as a
``[memory]`` event with a signed byte count. Running the region under
``torch.profiler.profile(profile_memory=True)`` and adding those events up in time order gives the
allocated bytes above the region's start at every moment; their highest value is the region's
peak above its start.

What it does not see: memory allocated before the region (parameters, optimizer state: add them
from outside when a whole-step peak is wanted) and memory not taken from PyTorch's allocator.
On an uncompiled step its peak equals MemTracker's peak minus the bytes alive at the start,
give or take a few small buffers no tensor owns (``tests/memory/test_profiled_peak.py``). On CUDA the caching allocator's
``max_memory_allocated`` already works under compile; this meter is for the CPU.

Example:
    >>> import torch
    >>> from torch import nn
    >>> net = nn.Linear(64, 64)
    >>> x = torch.randn(32, 64)
    >>> with ProfiledPeakMeter() as meter:
    ...     net(x).sum().backward()
    >>> meter.result.peak_bytes >= 32 * 64 * 4  # the output, at least
    True
"""
from __future__ import annotations

import itertools
from dataclasses import dataclass

from torch.profiler import ProfilerActivity, profile

from .meter import Meter

_MEMORY_EVENT = '[memory]'


@dataclass(frozen=True)
class ProfiledPeak:
    """Allocated bytes over a region, relative to its start.

    Attributes:
        peak_bytes: The highest allocated bytes above the region's start.
        end_bytes: Allocated bytes above the start when the region ended (what it left alive:
            e.g. gradients, or optimizer state created in it).
        allocations: How many allocations the region made.
    """

    peak_bytes: int
    end_bytes: int
    allocations: int


class ProfiledPeakMeter(Meter[ProfiledPeak]):
    """Measures the peak of CPU memory allocated above a region's start from the profiler's
    memory events; works around compiled code.

    The profiler slows the region down (one event per allocation): time the steps around it,
    not the one it measures.

    Example:
        >>> import torch
        >>> meter = ProfiledPeakMeter()
        >>> meter.start()
        >>> kept = torch.empty(1024, dtype=torch.uint8)
        >>> del kept
        >>> meter.stop()
        ProfiledPeak(peak_bytes=1024, end_bytes=0, allocations=1)
    """

    def __init__(self) -> None:
        super().__init__()
        self._profiler: profile | None = None

    @property
    def running(self) -> bool:
        return self._profiler is not None

    def _start(self) -> None:
        self._profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._profiler.__enter__()

    def _stop(self) -> ProfiledPeak:
        profiler, self._profiler = self._profiler, None
        profiler.__exit__(None, None, None)
        events = sorted((event for event in profiler.profiler.kineto_results.events()
                         if event.name() == _MEMORY_EVENT and event.device_type().name == 'CPU'),
                        key=lambda event: event.start_ns())
        running = list(itertools.accumulate(event.nbytes() for event in events))
        return ProfiledPeak(peak_bytes=max([0, *running]),
                            end_bytes=running[-1] if running else 0,
                            allocations=sum(event.nbytes() > 0 for event in events))
