"""How to measure one training step of a fixed batch (:class:`StepProbe`), and what every pass
holds whatever its size (:func:`per_pass_bytes`).

A probe says how to run a trial pass of part of the batch and how to run the forward pass for
recording, so the same planning serves MMEngine runs (``MemoryBudgetHook``) and the benchmark's
workloads.
"""
from __future__ import annotations

import functools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
from torch import nn

from ..checkpoint import build_chain, record_step
from ..checkpoint.chain import Chain
from ..common.parameters import model_device
from ..memory import TrialPeaks, trial_peak, trial_peaks, trial_seconds


_T = TypeVar('_T')


def _same(value: _T) -> _T:
    """``value`` as it is (what a single process agrees on)."""
    return value


@dataclass
class StepProbe:
    """How to measure one training step of a fixed batch.

    Attributes:
        model: The trained model (unwrapped): trials restore its gradients, buffers and RNG.
        optimizer: Its optimizer (its state, and what its first step creates, count).
        batch_size: Samples in the batch.
        run_part: ``run_part(size)``: the forward and backward pass of the batch's first
            ``size`` samples, the loss weighted by ``size / batch_size``, no optimizer step.
        forward_part: ``forward_part(size)``: the forward pass of the batch's first ``size``
            samples, returning the loss (recorded for checkpoint plans).
        agree_peak: Turns this process's measured peak (``None``: out of memory) into the one
            all processes use (e.g. the largest over ranks).
        agree_seconds: The same for a measured time.
        share_chain: The same for the recorded step (e.g. rank 0's, broadcast).
        accumulates: Gradients are accumulated over several batches (MMEngine's
            ``accumulative_counts``), so they are held while even an undivided batch runs.
        cold_passes: Any timed pass may be slow the first time, not only one larger than
            those before (new memory), so every time is the faster of two passes: on a GPU
            cuDNN and cuBLAS choose their kernels per shape, and the step-peak meter empties
            the allocator's cache before each measured pass, so that a pass after one takes
            its memory from the device again. ``None``: whether the model is on a GPU.
    """

    model: nn.Module
    optimizer: torch.optim.Optimizer | None
    batch_size: int
    run_part: Callable[[int], object]
    forward_part: Callable[[int], torch.Tensor]
    agree_peak: Callable[[int | None], int | None] = _same
    agree_seconds: Callable[[float], float] = _same
    share_chain: Callable[[Chain], Chain] = _same
    accumulates: bool = False
    cold_passes: bool | None = None

    def __post_init__(self) -> None:
        if self.cold_passes is None:
            self.cold_passes = model_device(self.model).type == 'cuda'

    def peak(self, size: int, gradients_held: bool = True) -> int | None:
        """The agreed peak of a trial pass of ``size`` samples (``None``: out of memory), the
        parameters holding gradients from the start (as for a micro-batch after the first, and
        for every batch when gradients accumulate over batches) unless ``gradients_held`` is
        false."""
        held = gradients_held or self.accumulates
        return self.agree_peak(trial_peak(lambda: self.run_part(size), self.model,
                                          self.optimizer, gradients_held=held))

    def peaks(self, size: int) -> TrialPeaks:
        """The agreed peaks of a trial pass of ``size`` samples as it starts without gradients
        and with them held (:func:`~mmdropit.memory.trial_peaks`: one pass on CPU); both held
        when gradients accumulate over batches."""
        if self.accumulates:
            held = self.peak(size)
            return TrialPeaks(held, held)
        peaks = trial_peaks(lambda: self.run_part(size), self.model, self.optimizer)
        return TrialPeaks(self.agree_peak(peaks.fresh), self.agree_peak(peaks.held))

    def seconds(self, size: int, passes: int = 2) -> float:
        """The agreed time of a trial pass of ``size`` samples: the fastest of ``passes``
        passes (the first may be cold: see :attr:`cold_passes`).

        Raises:
            torch.OutOfMemoryError: A pass ran out of memory, in any process (all raise it).
        """
        try:
            taken = min(trial_seconds(lambda: self.run_part(size), self.model)
                        for _ in range(passes))
        except torch.OutOfMemoryError:
            torch.cuda.empty_cache()
            taken = math.inf
        agreed = self.agree_seconds(taken)
        if math.isinf(agreed):
            raise torch.OutOfMemoryError(f'a pass of {size} samples ran out of memory')
        return agreed

    def seconds_once_warm(self, size: int) -> float:
        """:meth:`seconds` of a size a pass has already run at (a measured pass, say, of the
        same size and combination): one pass, or the faster of two where any pass may be cold
        (:attr:`cold_passes`)."""
        return self.seconds(size, 2 if self.cold_passes else 1)

    def chain(self, size: int) -> Chain:
        """The recorded forward pass of the batch's first ``size`` samples, cut into the chain
        checkpoint plans are searched on."""
        step = functools.partial(self.forward_part, size)
        return self.share_chain(build_chain(record_step(self.model, step), self.model))


def per_pass_bytes(batch_size: int, activations: int, one_sample: Callable[[], int]) -> int:
    """Bytes a pass holds beyond the model's state whatever its size (FSDP2's gathered
    parameters, workspaces), on the line through the activations of the whole batch and of
    ``one_sample()`` (0 when that line says less, or one sample cannot train alone).

    Example:
        >>> per_pass_bytes(16, 16 * 10 + 40, lambda: 10 + 40)
        40
    """
    if batch_size < 2:
        return 0
    try:
        single = one_sample()
    except (RuntimeError, ValueError):  # e.g. BatchNorm1d cannot train on one sample
        return 0
    return max((batch_size * single - activations) // (batch_size - 1), 0)
