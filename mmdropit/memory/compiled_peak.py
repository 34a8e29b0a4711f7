"""The peak of a whole training step that may run compiled code (:class:`CompiledStepPeakMeter`).

:class:`~.peak.StepPeakMeter` on CPU is a dispatch mode (MemTracker), under which dynamo skips
compiled code: it would measure another program. This meter leaves compiled code as it runs.
"""
from __future__ import annotations

import torch
from torch import nn

from .meter import Meter
from .peak import StepPeakMeter, bytes_on, optimizer_tensors, resolve_device
from .profiled_peak import ProfiledPeakMeter


class CompiledStepPeakMeter(Meter[int]):
    """The peak of a training step in bytes, compiled or not.

    On CUDA it is the allocator's peak over the region (:class:`~.peak.StepPeakMeter`, its
    counters reset at the start: every tensor on the device). On CPU it is what ``model`` and
    ``optimizer`` hold at the start (parameters, buffers, gradients, optimizer state; each
    storage once) plus the highest the CPU allocator's profiled events reach above the start
    (:class:`~.profiled_peak.ProfiledPeakMeter`): the figure :class:`~.peak.StepPeakMeter`
    gives an eager step, give or take a few small buffers no tensor owns. The profiler slows the
    measured step.

    Args:
        model: The trained model.
        optimizer: Its optimizer.

    Example:
        >>> net = nn.Linear(256, 256)
        >>> compiled = torch.compile(net)
        >>> with CompiledStepPeakMeter(net) as meter:
        ...     compiled(torch.randn(64, 256)).sum().backward()
        >>> meter.result >= 2 * 257 * 256 * 4   # parameters and their gradients, at least
        True
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> None:
        super().__init__()
        self.model, self.optimizer = model, optimizer
        self.device = resolve_device(model, None)
        self._meter: StepPeakMeter | ProfiledPeakMeter | None = None
        self._held = 0

    @property
    def running(self) -> bool:
        return self._meter is not None

    def _start(self) -> None:
        if self.device.type == 'cuda':
            self._meter = StepPeakMeter(self.model, self.optimizer)
        else:
            params = list(self.model.parameters())
            self._held = bytes_on([*params, *(p.grad for p in params if p.grad is not None),
                                   *self.model.buffers(), *optimizer_tensors(self.optimizer)],
                                  self.device)
            self._meter = ProfiledPeakMeter()
        self._meter.start()

    def _stop(self) -> int:
        meter, self._meter = self._meter, None
        return self._held + meter.stop().peak_bytes  # nothing held apart on CUDA
