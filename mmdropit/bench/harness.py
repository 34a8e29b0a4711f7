"""Measure a training step under several variants, side by side in one process.

Per variant: saved-activation bytes, the step peak by category, and the step time, timed
alternately with the baseline so each ratio compares steps taken under the same machine load;
on a GPU also the host's share of the step (the time until its calls returned).
"""
from __future__ import annotations

import contextlib
import statistics
import time
from typing import ContextManager

import torch
from torch._dynamo.utils import counters

from ..errors import ConfigError
from ..memory import SavedTensorMeter, StepPeakMeter
from .report import Measurement
from .variants import BASELINE, Variant
from .workload import Workload


def train_step(work: Workload, variant: Variant, optimizer: torch.optim.Optimizer) -> None:
    """One training step of ``work`` under ``variant`` (its ``forward`` context around each
    forward pass; ``prepare`` is the caller's)."""
    for part_loss in work.losses():
        with variant.forward(work):
            loss = part_loss()
        loss.backward()
        del loss
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def _eager_if(compiled: bool) -> ContextManager[None]:
    """Run a compiled model eagerly inside (the saved-tensor meter's hooks would make dynamo
    break the graph at every saved tensor and compile the pieces, minutes on a GPU machine)."""
    return torch.compiler.set_stance('force_eager') if compiled else contextlib.nullcontext()


def _compiling_step(work: Workload, variant: Variant,
                    optimizer: torch.optim.Optimizer) -> None:
    breaks_before = sum(counters['graph_break'].values())
    train_step(work, variant, optimizer)
    work.graph_breaks[variant.name] = sum(counters['graph_break'].values()) - breaks_before


def _timed_step(work: Workload, variant: Variant, optimizer: torch.optim.Optimizer,
                device: torch.device) -> tuple[float, float]:
    """Seconds of one step, and seconds until its calls returned (before waiting for the GPU:
    the host's share; the same number on a CPU)."""
    if device.type == 'cuda':
        torch.cuda.synchronize(device)
    start = time.perf_counter()
    train_step(work, variant, optimizer)
    issued = time.perf_counter()
    if device.type == 'cuda':
        torch.cuda.synchronize(device)
    return time.perf_counter() - start, issued - start


def benchmark_workload(work: Workload, variants: list[Variant], steps: int,
                       device: torch.device,
                       compiled: bool = False) -> tuple[list[Measurement], list[str]]:
    """Measure one workload under each variant; ``variants[0]`` must be the baseline.

    Per variant, one step under the saved-tensor meter (it is also the warm-up: the meter does not
    slow the step down, and the optimizer creates its state there) and one under the peak meter.
    A compiled model (``compiled``, or a variant that compiles it: ``variant.compiled``) first
    takes one step per variant without meters, which compiles what the timed steps run; its
    graph breaks go to ``work.graph_breaks``. Its saved-tensor step runs eagerly (the meter's
    hooks would break the graph at every saved tensor): *saved* is the eager step's, the peak
    and the time the compiled one's.
    Then ``steps`` rounds time every variant once, in order, so each variant's step is timed next
    to a baseline step under the same machine load. Each variant's peak and each round's times
    are printed as measured (a run stopped by a time limit keeps them in its log).

    Args:
        work: The model and its batch.
        variants: The variants, baseline first.
        steps: Number of timed rounds.
        device: The device the model is on.
        compiled: Whether ``work.model`` was compiled.

    Returns:
        One :class:`Measurement` per variant that ran, and one line per variant that failed on
        this model (e.g. an operator without a bfloat16 kernel, a technique with nothing to
        convert in it); the baseline must not fail.
    """
    optimizer = torch.optim.SGD(work.model.parameters(), lr=1e-4, momentum=0.9)
    work.optimizer = optimizer
    working, skipped, saved, peaks = [], [], {}, {}
    for variant in variants:
        try:
            with variant.prepare(work):
                if compiled or variant.compiled:
                    _compiling_step(work, variant, optimizer)
                with SavedTensorMeter(work.model) as saved_meter, \
                        _eager_if(compiled or variant.compiled):
                    train_step(work, variant, optimizer)
                with StepPeakMeter(work.model, optimizer, device, reset_peak=True) as peak_meter:
                    train_step(work, variant, optimizer)
        except (RuntimeError, NotImplementedError, ConfigError) as error:
            if variant.name == BASELINE:
                raise
            optimizer.zero_grad(set_to_none=True)
            skipped.append(f'{work.name} / {variant.name}: {str(error).splitlines()[0]}')
            continue
        working.append(variant)
        saved[variant.name] = saved_meter.result
        peaks[variant.name] = peak_meter.result
        print(f'  {work.name} / {variant.name}: peak {peak_meter.result.peak_bytes / 2**20:.1f} '
              f'MiB, saved {saved_meter.result.total_bytes / 2**20:.1f} MiB', flush=True)

    times: dict[str, list[float]] = {variant.name: [] for variant in working}
    host_times: dict[str, list[float]] = {variant.name: [] for variant in working}
    for round_number in range(1, steps + 1):
        for variant in working:
            with variant.prepare(work):
                seconds, host_seconds = _timed_step(work, variant, optimizer, device)
            times[variant.name].append(seconds)
            host_times[variant.name].append(host_seconds)
        print(f'  {work.name} round {round_number}/{steps} (ms): ' + ', '.join(
            f'{name} {values[-1] * 1e3:.1f}' for name, values in times.items()), flush=True)

    measurements = []
    for variant in working:
        ratios = [t / b for t, b in zip(times[variant.name], times[BASELINE])]
        measurements.append(Measurement(
            model=work.name, variant=variant.name, saved=saved[variant.name],
            peak=peaks[variant.name], step_seconds=statistics.median(times[variant.name]),
            time_ratio=statistics.median(ratios), round_seconds=tuple(times[variant.name]),
            host_seconds=(statistics.median(host_times[variant.name])
                          if device.type == 'cuda' else None)))
    return measurements, skipped
