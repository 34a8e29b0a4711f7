"""Measure the peak (or the time) of a trial forward and backward pass, then put training state
back.

A trial stands for one micro-batch in the middle of an accumulation window: every trainable
parameter already holds a gradient, the optimizer state is as large as it will be after the first
step, and the trial's own gradients, BatchNorm statistics and RNG draws are undone afterwards.

Example:
    >>> from torch import nn
    >>> net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))
    >>> opt = torch.optim.AdamW(net.parameters())
    >>> peak = trial_peak(lambda: net(torch.randn(32, 64)).sum().backward(), net, opt)
    >>> param_bytes = sum(p.numel() * p.element_size() for p in net.parameters())
    >>> peak > 4 * param_bytes   # parameters, gradients, two Adam moments, activations
    True
    >>> all(p.grad is None for p in net.parameters())
    True

:func:`trial_peaks` measures a pass both as it starts with gradients and without them.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Callable

import torch
from torch import nn

from ..common.parameters import local_part, model_device
from ..common.timing import seconds_of
from ..common.training_state import preserved_training_state
from .peak import StepPeak, StepPeakMeter

# Per-parameter state tensors that torch's optimizers create at their first step (same size as
# the parameter); Adagrad, and any optimizer already stepped, report their state as it is.
_MOMENTS_PER_PARAMETER = {
    'Adam': 2, 'AdamW': 2, 'Adamax': 2, 'NAdam': 2, 'RAdam': 2, 'Adadelta': 2, 'RMSprop': 1,
    'SGD': 1,
}


def pending_optimizer_state_bytes(optimizer: torch.optim.Optimizer | None) -> int:
    """Bytes of optimizer state that the first ``step()`` will create and does not exist yet.

    Zero once the optimizer has state. For torch's own optimizers the count is their moments
    (``amsgrad`` adds one, plain SGD without momentum has none); for others it is unknown and 0.
    This process's shards only, under FSDP2.
    """
    if optimizer is None or optimizer.state:
        return 0
    total = 0
    for group in optimizer.param_groups:
        moments = _MOMENTS_PER_PARAMETER.get(type(optimizer).__name__, 0)
        if type(optimizer).__name__ == 'SGD' and not group.get('momentum'):
            moments = 0
        if type(optimizer).__name__ == 'RMSprop':
            moments += bool(group.get('momentum')) + bool(group.get('centered'))
        moments += bool(group.get('amsgrad'))
        total += moments * sum(local_part(p).numel() * p.element_size()
                               for p in group['params'] if p.requires_grad)
    return total


def state_bytes(model: nn.Module, optimizer: torch.optim.Optimizer | None = None) -> int:
    """Bytes of what a training step holds whatever its activations: parameters, a gradient
    for every trainable parameter, buffers and optimizer state (including what its first
    ``step()`` will create). This process's shards only, under FSDP2.

    Example:
        >>> from torch import nn
        >>> net = nn.Linear(10, 10)   # 110 float32 parameters
        >>> state_bytes(net, torch.optim.AdamW(net.parameters()))  # + gradients, two moments
        1760
    """
    def size(tensors) -> int:
        return sum(local_part(t).numel() * t.element_size() for t in tensors)

    params = list(model.parameters())
    optimizer_state = [value for state in (optimizer.state.values() if optimizer else ())
                       for value in state.values() if isinstance(value, torch.Tensor)]
    return (size(params) + size(p for p in params if p.requires_grad) + size(model.buffers())
            + size(optimizer_state) + pending_optimizer_state_bytes(optimizer))


@contextlib.contextmanager
def _gradients_set_then_restored(model: nn.Module, held: bool = True) -> Iterator[None]:
    """Give every trainable parameter a gradient (``held``: as in an accumulation window) or
    none (as after ``zero_grad(set_to_none=True)``), and restore the gradients that existed
    before on exit, also those FSDP2 keeps unsharded (:func:`_unsynced_gradients_restored`)."""
    params = [param for param in model.parameters() if param.requires_grad]
    before = [param.grad for param in params]
    for param in params:
        if not held:
            param.grad = None
        elif param.grad is None:
            param.grad = torch.zeros_like(param)
        else:
            param.grad = param.grad.clone()
    try:
        with _unsynced_gradients_restored(model):
            yield
    finally:
        for param, grad in zip(params, before):
            param.grad = grad


@contextlib.contextmanager
def _unsynced_gradients_restored(model: nn.Module) -> Iterator[None]:
    """Put back the gradients FSDP2 keeps unsharded, as they were before the block. A backward
    with gradient sync off (a micro-batch that is not the last, as a trial runs) leaves its
    gradients in each FSDP2 parameter's unsharded copy (``FSDPParam._unsharded_param.grad``,
    or ``unsharded_accumulated_grad`` in the reduce dtype; torch's private records), where the
    next synced backward adds them to what it reduces: a trial's gradients would have gone
    into the first update."""
    records = [record for module in model.modules()
               if (group := _fsdp_param_group(module)) is not None
               for record in group.fsdp_params]
    saved = [(_unsharded_grad(record), record.unsharded_accumulated_grad) for record in records]
    saved = [tuple(None if grad is None else grad.clone() for grad in pair) for pair in saved]
    try:
        yield
    finally:
        for record, (grad, accumulated) in zip(records, saved):
            unsharded = getattr(record, '_unsharded_param', None)
            if unsharded is not None:
                unsharded.grad = grad
            record.unsharded_accumulated_grad = accumulated


def _fsdp_param_group(module: nn.Module) -> object | None:
    """The FSDP2 parameter group ``fully_shard`` put on ``module``, if any."""
    get_state = getattr(module, '_get_fsdp_state', None)
    return None if get_state is None else getattr(get_state(), '_fsdp_param_group', None)


def _unsharded_grad(record: object) -> torch.Tensor | None:
    unsharded = getattr(record, '_unsharded_param', None)
    return None if unsharded is None else unsharded.grad


def trial_peak(run: Callable[[], object], model: nn.Module,
               optimizer: torch.optim.Optimizer | None = None,
               gradients_held: bool = True) -> int | None:
    """The peak in bytes of ``run()`` (a forward and backward pass of ``model``).

    Counted: parameters, gradients of every trainable parameter, buffers, optimizer state
    (including the state a first step will create, see :func:`pending_optimizer_state_bytes`),
    activations and temporaries. On CUDA the whole device's allocated peak is read.

    Args:
        run: The trial; it may call ``backward`` but must not step the optimizer.
        model: The trained model (unwrapped), whose gradients, buffers and RNG are restored.
        optimizer: Its optimizer.
        gradients_held: Every trainable parameter holds a gradient from the start, as for a
            micro-batch that is not the first of its accumulation window; ``False``: none does,
            as for a batch that starts a step.

    Returns:
        The peak, or ``None`` when the trial ran out of CUDA memory.
    """
    result = _metered_pass(run, model, optimizer, gradients_held)
    return None if result is None else result.peak_bytes + pending_optimizer_state_bytes(optimizer)


def _metered_pass(run: Callable[[], object], model: nn.Module,
                  optimizer: torch.optim.Optimizer | None, gradients_held: bool
                  ) -> StepPeak | None:
    """``run()`` under the step-peak meter, training state put back (``None``: it ran out of
    CUDA memory)."""
    meter = StepPeakMeter(model, optimizer)
    try:
        with preserved_training_state(model), \
                _gradients_set_then_restored(model, gradients_held), meter:
            run()
    except torch.OutOfMemoryError:
        torch.cuda.empty_cache()
        return None
    return meter.result


@dataclass(frozen=True)
class TrialPeaks:
    """The peaks of one trial pass, as it starts with and without gradients.

    Attributes:
        fresh: No parameter holds a gradient when it starts (a batch that starts a step);
            ``None``: it ran out of CUDA memory.
        held: Every trainable parameter holds one (a micro-batch after the first, every batch
            of an accumulation window); ``None``: it ran out of CUDA memory.
    """

    fresh: int | None
    held: int | None


def trial_peaks(run: Callable[[], object], model: nn.Module,
                optimizer: torch.optim.Optimizer | None = None) -> TrialPeaks:
    """The peaks of ``run()`` as :func:`trial_peak` measures them, both with and without
    gradients held from the start.

    On CPU one pass measures both: a held gradient adds its bytes at every moment and nothing
    else (autograd adds a new gradient into it in place, where it would otherwise keep the new
    one), so the held peak is the highest of everything but the gradients, plus every
    trainable parameter's gradient. On CUDA, where the allocator's counters cannot tell
    gradients apart, two passes run.

    Example:
        >>> from torch import nn
        >>> net = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 1))
        >>> run = lambda: net(torch.randn(32, 64)).sum().backward()
        >>> peaks = trial_peaks(run, net)
        >>> peaks.held == trial_peak(run, net, gradients_held=True)
        True
        >>> peaks.fresh == trial_peak(run, net, gradients_held=False)
        True
    """
    fresh = _metered_pass(run, model, optimizer, gradients_held=False)
    pending = pending_optimizer_state_bytes(optimizer)
    if fresh is None:  # with gradients held it needs more
        return TrialPeaks(None, None)
    if fresh.gradient_free_peak_bytes is None:  # CUDA: a second pass
        return TrialPeaks(fresh.peak_bytes + pending,
                          trial_peak(run, model, optimizer, gradients_held=True))
    gradients = sum(local_part(param).numel() * param.element_size()
                    for param in model.parameters() if param.requires_grad)
    return TrialPeaks(fresh.peak_bytes + pending,
                      fresh.gradient_free_peak_bytes + gradients + pending)


def trial_seconds(run: Callable[[], object], model: nn.Module) -> float:
    """The wall time of ``run()`` (a forward and backward pass of ``model``), with the model's
    gradients, buffers and RNG restored afterwards as in :func:`trial_peak` (no meter runs, so
    the time is that of training)."""
    with preserved_training_state(model), _gradients_set_then_restored(model):
        return seconds_of(run, model_device(model))
