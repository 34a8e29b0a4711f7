"""The memory peak of one training step, split by what the memory holds.

On CPU (and any non-CUDA device) the step runs under PyTorch's
:class:`torch.distributed._tools.mem_tracker.MemTracker`, a dispatch mode that sees every tensor
created and freed and files its storage under a category. MemTracker keeps the breakdown at the
moment of the total peak (a copy of its running counts taken whenever the total exceeds its
previous maximum), so the categories add up to the peak. The total peak often falls late in the
step (all gradients and the optimizer state alive) when most activations are already freed, so
the activation peak is followed separately, after every operation.

On CUDA the caching allocator's own counters are read instead (``torch.cuda.max_memory_allocated``
and ``max_memory_reserved``).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn
from torch.distributed._tools.mem_tracker import MemTracker

from ..common.parameters import model_device
from .meter import Meter

CATEGORIES = ('parameter', 'buffer', 'gradient', 'activation', 'temporary', 'optimizer_state',
              'other')
_TRACKER_CATEGORIES = {
    'Parameter': 'parameter',
    'Buffer': 'buffer',
    'Gradient': 'gradient',
    'Activation': 'activation',
    'Temp': 'temporary',
    'Optstate': 'optimizer_state',
    'Other': 'other',
}
_TRACKER_TOTAL = 'Total'
_ACTIVATION_KINDS = ('Activation', 'Temp')
_GRADIENT = 'Gradient'


@dataclass(frozen=True)
class StepPeak:
    """The peak memory of a measured region and what it was made of.

    Attributes:
        device: The measured device, e.g. ``'cpu'`` or ``'cuda:0'``.
        peak_bytes: Bytes held by tensors at the highest point.
        by_category: Bytes per category (names from :data:`CATEGORIES`). On CPU: the breakdown
            *at the moment of the total peak*, so the values add up to ``peak_bytes``. On CUDA only
            what can be known from outside: ``'parameter'``, ``'buffer'`` and ``'optimizer_state'``
            (sizes at the end of the region) and ``'other'``, the rest of the peak (activations,
            temporaries and gradients together).
        activation_peak_bytes: The highest activation plus temporary bytes at any moment of the
            region (not necessarily the moment of the total peak): the "activation peak" of
            memory-saving papers, parameters, gradients, buffers and optimizer state left out.
            A gradient counts as temporary from the operation that computes it until autograd
            hands it to its parameter. ``None`` on CUDA, where it is not known.
        reserved_bytes: Peak bytes reserved by the CUDA caching allocator; ``None`` on CPU.
        gradient_free_peak_bytes: The highest bytes held by everything but gradients at any
            moment of the region: what the region's peak would be, plus the bytes of the
            gradients, had every gradient existed from its start (as in an accumulation
            window). ``None`` on CUDA, where it is not known.

    Example:
        >>> peak = StepPeak('cpu', 700, {'parameter': 400, 'activation': 200, 'temporary': 100},
        ...                 activation_peak_bytes=350)
        >>> peak.peak_bytes - peak.by_category['parameter']
        300
    """

    device: str
    peak_bytes: int
    by_category: dict[str, int] = field(default_factory=dict)
    activation_peak_bytes: int | None = None
    reserved_bytes: int | None = None
    gradient_free_peak_bytes: int | None = None


class _NoHook:
    """Stands in for the gradient hooks MemTracker would put on a frozen parameter."""

    def remove(self) -> None:
        """Nothing to remove."""


class _ActivationPeakTracker(MemTracker):
    """MemTracker that also keeps the highest activation + temporary bytes, and the highest
    bytes of everything but gradients, after any operation.

    MemTracker registers a gradient hook on every parameter of every module it sees, which raises
    for parameters that do not require gradients (frozen stages of a detector). Those parameters
    are marked as already hooked: they never receive a gradient, so nothing is missed. Under
    FSDP2 a module's parameters during its forward are the gathered ones, new tensors each
    time, so they are marked as each module's forward starts.
    """

    def __init__(self, device: torch.device, frozen: list[nn.Parameter]) -> None:
        super().__init__()
        self.device = device
        self.activation_peak = 0
        self.gradient_free_peak = 0
        for param in frozen:
            self._param_to_grad_hook_handles[param] = (_NoHook(), _NoHook())

    def _pre_fw_hook(self, module: nn.Module, inputs: Any) -> None:
        """Allow a root module to run forward more than once in a region (micro-batches,
        accumulation): MemTracker refuses, so the module's per-module statistics from the
        previous forward are dropped first. Totals and the peak are unaffected."""
        name = self._mod_tracker.get_known_fqn(module)
        if (module in self.memory_tracking and not self._mod_tracker.is_bw
                and set(self._mod_tracker.parents) - {name} == {'Global'}):
            del self.memory_tracking[module]
        for param in module.parameters():
            if not param.requires_grad:
                self._param_to_grad_hook_handles.setdefault(param, (_NoHook(), _NoHook()))
        super()._pre_fw_hook(module, inputs)

    def _update_peak_stats(self, peak_state: object) -> None:
        """Keep the totals' peak only. MemTracker also updates the peak of every module it has
        seen after every operation, a cost that grows with the model (most of the meter's
        overhead on a detector) for per-module figures nothing here reads."""
        for device, counts in self._curr_mem_snap.items():
            if self._peak_mem.get(device, 0) < counts[_TRACKER_TOTAL]:
                self._peak_mem[device] = counts[_TRACKER_TOTAL]
                self._peak_mem_snap[device] = dict(counts)

    def __torch_dispatch__(self, func: torch._ops.OpOverload, types: tuple[type, ...],
                           args: tuple[Any, ...] = (), kwargs: dict[str, Any] | None = None) -> Any:
        result = super().__torch_dispatch__(func, types, args, kwargs)
        counts = self._curr_mem_snap.get(self.device, {})
        activation = gradient = 0
        for key, nbytes in counts.items():
            name = getattr(key, 'value', key)
            if name in _ACTIVATION_KINDS:
                activation += nbytes
            elif name == _GRADIENT:
                gradient += nbytes
        self.activation_peak = max(self.activation_peak, activation)
        self.gradient_free_peak = max(self.gradient_free_peak,
                                      counts.get(_TRACKER_TOTAL, 0) - gradient)
        return result


def resolve_device(model: nn.Module, device: str | torch.device | None) -> torch.device:
    """``device``, or ``model``'s when ``None``; a CUDA device with its index."""
    if device is not None:
        resolved = torch.device(device)
    else:
        resolved = model_device(model)
    if resolved.type == 'cuda' and resolved.index is None:
        resolved = torch.device('cuda', torch.cuda.current_device())
    return resolved


def bytes_on(tensors: list[torch.Tensor], device: torch.device) -> int:
    """The bytes of the storages of those of ``tensors`` on ``device``, each once."""
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes()
                for t in tensors if t.device == device}
    return sum(storages.values())


def optimizer_tensors(optimizer: torch.optim.Optimizer | None) -> list[torch.Tensor]:
    """The tensors of ``optimizer``'s state (none without one)."""
    if optimizer is None:
        return []
    return [value for state in optimizer.state.values() for value in state.values()
            if isinstance(value, torch.Tensor)]


class StepPeakMeter(Meter[StepPeak]):
    """Measure the memory peak of a training step by category.

    Use it as a context manager around one step (forward, backward, optimizer step), or call
    :meth:`start` and :meth:`stop` from two places (e.g. the ``before_train_iter`` and
    ``after_train_iter`` of a hook).

    On CPU, tensors that exist before :meth:`start` are counted only when they belong to ``model``
    (parameters, buffers, gradients) or ``optimizer`` (state); an input batch built beforehand is
    not counted, one built inside the region is an activation. The model may run forward
    several times in one region (micro-batches, gradient accumulation).

    On CUDA the peak is that of the whole device (every tensor, also those of other models).
    With ``reset_peak=True`` :meth:`start` resets the allocator's peak counters, so the peak is that
    of the region. With ``reset_peak=False`` nothing is reset and the numbers are the peak since
    the last reset by anyone (e.g. MMEngine's ``LoggerHook``, which resets at every log line), which
    may lie before :meth:`start`; use this inside a training loop that reads the counters itself.

    Args:
        model: The trained model.
        optimizer: Its optimizer, whose state is filed as ``'optimizer_state'``.
        device: The device to measure; ``None`` takes the device of the first parameter.
        reset_peak: On CUDA, reset the peak counters at :meth:`start`. Ignored on CPU.

    Example:
        >>> net = nn.Linear(256, 256)
        >>> opt = torch.optim.SGD(net.parameters(), lr=0.1)
        >>> with StepPeakMeter(net, opt) as meter:
        ...     net(torch.randn(64, 256)).square().mean().backward()
        ...     opt.step()
        ...     opt.zero_grad()
        >>> meter.result.by_category['parameter']
        263168
    """

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer | None = None,
                 device: str | torch.device | None = None, reset_peak: bool = True) -> None:
        super().__init__()
        self.model = model
        self.optimizer = optimizer
        self.device = resolve_device(model, device)
        self.reset_peak = reset_peak
        self._tracker: _ActivationPeakTracker | None = None
        self._cuda_running = False

    @property
    def running(self) -> bool:
        """Whether the meter is between :meth:`start` and :meth:`stop`."""
        return self._tracker is not None or self._cuda_running

    def _start(self) -> None:
        if self.device.type == 'cuda':
            if self.reset_peak:
                torch.cuda.synchronize(self.device)
                # the blocks earlier steps left cached would count as this step's reserved peak
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(self.device)
            self._cuda_running = True
            return
        frozen = [param for param in self.model.parameters() if not param.requires_grad]
        tracker = _ActivationPeakTracker(self.device, frozen)
        tracker.track_external(*(obj for obj in (self.model, self.optimizer) if obj is not None))
        tracker.__enter__()
        self._tracker = tracker

    def _stop(self) -> StepPeak:
        return self._stop_cuda() if self._cuda_running else self._stop_tracker()

    def _stop_tracker(self) -> StepPeak:
        tracker, self._tracker = self._tracker, None
        tracker.__exit__(None, None, None)
        snapshot = tracker.get_tracker_snapshot('peak').get(self.device, {})
        by_category = dict.fromkeys(CATEGORIES, 0)
        for key, nbytes in snapshot.items():
            name = getattr(key, 'value', key)
            if name != _TRACKER_TOTAL:
                by_category[_TRACKER_CATEGORIES[name]] += nbytes
        return StepPeak(device=str(self.device), peak_bytes=snapshot.get(_TRACKER_TOTAL, 0),
                        by_category=by_category, activation_peak_bytes=tracker.activation_peak,
                        gradient_free_peak_bytes=tracker.gradient_free_peak)

    def _stop_cuda(self) -> StepPeak:
        self._cuda_running = False
        torch.cuda.synchronize(self.device)
        peak = torch.cuda.max_memory_allocated(self.device)
        known = {
            'parameter': bytes_on(list(self.model.parameters()), self.device),
            'buffer': bytes_on(list(self.model.buffers()), self.device),
            'optimizer_state': bytes_on(optimizer_tensors(self.optimizer), self.device),
        }
        known['other'] = max(peak - sum(known.values()), 0)
        return StepPeak(device=str(self.device), peak_bytes=peak, by_category=known,
                        reserved_bytes=torch.cuda.max_memory_reserved(self.device))
