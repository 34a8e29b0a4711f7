"""Log what a training step really holds in memory: saved activations and the step peak.

Example config::

    custom_hooks = [dict(type='MemoryReportHook', interval=100)]
"""
from __future__ import annotations

import torch
from mmengine.registry import HOOKS

from ...common.parameters import model_device
from ...common.units import MIB
from ...errors import ConfigError
from ...memory import CompiledStepPeakMeter, SavedTensorMeter, StepPeak, StepPeakMeter
from ..runner_model import compiles_model, unwrap
from .summary import SummaryHook


@HOOKS.register_module()
class MemoryReportHook(SummaryHook):
    """Measure the first training iteration and then every ``interval`` iterations.

    A measured iteration (the whole ``train_step``: forward, backward, optimizer step) runs
    under :class:`~mmdropit.memory.SavedTensorMeter` and
    :class:`~mmdropit.memory.StepPeakMeter`. The figures go to the log as one line and to
    the visualizer's backends as ``memory/*`` scalars:

    - ``saved_activation_mib``: distinct storages autograd kept for backward;
    - ``step_peak_mib``: peak of the step; on CPU also ``<category>_mib`` at that moment
      and ``activation_peak_mib`` (activations + temporaries, at their own peak);
    - on CUDA ``max_reserved_mib``. The CUDA peak counters are read, never reset, so
      LoggerHook's own ``memory`` figure (which resets them) is left intact; on CUDA the
      step peak is therefore the peak since LoggerHook's last log line.

    The first measured iteration is also summed up in one line starting
    ``mmdropit: MemoryReportHook:`` (its step peak and saved activations).

    On CPU the measurement runs under PyTorch's MemTracker (a dispatch mode), which slows
    the measured iteration; ``time`` in that iteration's log line includes it.

    Under ``compile=True`` the second iteration is measured instead of the first, which
    compiles (on CPU the next one where another meter's profiler runs then), and only the step
    peak: on CPU through :class:`~mmdropit.memory.CompiledStepPeakMeter` (MemTracker's dispatch
    mode would make dynamo leave the train step uncompiled for the whole run), on CUDA from the
    allocator as without compile; saved activations are not measured (dynamo guards on the
    saved-tensor hooks that count them, and would compile the step again for each
    measurement).

    Args:
        interval: measure every ``interval`` training iterations (and the first one).

    Attributes:
        last_scalars: The figures of the last measured iteration (empty before the first).
    """

    priority = 'NORMAL'  # after_train_iter before LoggerHook (BELOW_NORMAL)

    def __init__(self, interval: int = 50) -> None:
        if not isinstance(interval, int) or interval < 1:
            raise ConfigError(f'MemoryReportHook interval must be an int >= 1, got {interval!r}')
        self.interval = interval
        self._meters: tuple[SavedTensorMeter | None,
                            StepPeakMeter | CompiledStepPeakMeter] | None = None
        self._compiled = False
        self._due = True  # the first measurement is still to come
        self._seen = 0  # training iterations this run has begun (a resumed one starts past 0)
        self.last_scalars: dict[str, float] = {}

    def before_run(self, runner) -> None:
        self._compiled = compiles_model(runner)

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        self._seen += 1
        if self._compiled and self._seen == 1:
            return  # it compiles the step: the next one is measured
        if not (self._due or (runner.iter + 1) % self.interval == 0):
            return
        optimizer = getattr(runner.optim_wrapper, 'optimizer', None)
        profiled = self._compiled and model_device(unwrap(runner.model)).type != 'cuda'
        if profiled and torch._C._autograd._profiler_enabled():
            self._due = True  # another meter's profiler runs (one at a time): the next one
            return
        saved = None if self._compiled else SavedTensorMeter(runner.model)
        if profiled:
            peak = CompiledStepPeakMeter(unwrap(runner.model), optimizer)
        else:
            peak = StepPeakMeter(runner.model, optimizer=optimizer, reset_peak=False)
        peak.start()
        if saved is not None:
            saved.start()
        self._meters = (saved, peak)
        self._due = False

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if self._meters is not None:
            self._report(runner)
        super().after_train_iter(runner, batch_idx, data_batch, outputs)

    def summary(self, runner) -> str | None:
        if not self.last_scalars:
            return None
        every = 'iteration' if self.interval == 1 else f'{self.interval} iterations'
        saved = self.last_scalars.get('saved_activation_mib')
        saved = ('saved activations not measured under compile' if saved is None
                 else f'saved activations {saved:.1f} MiB')
        return (f'iteration {runner.iter + 1}: step peak '
                f'{self.last_scalars["step_peak_mib"]:.1f} MiB, {saved} (measured again every '
                f'{every})')

    def _report(self, runner) -> None:
        """Stop the meters of this iteration and log and add their figures."""
        saved_meter, peak_meter = self._meters
        self._meters = None
        saved = None if saved_meter is None else saved_meter.stop().total_bytes
        peak = peak_meter.stop()
        if isinstance(peak, int):  # the compiled step's on CPU: its total alone
            peak = StepPeak(str(peak_meter.device), peak, {})
        scalars = self.scalars(saved, peak)
        self.last_scalars = scalars
        runner.visualizer.add_scalars(
            {f'memory/{name}': value for name, value in scalars.items()}, step=runner.iter + 1)
        runner.logger.info(f'memory at iter {runner.iter + 1}: ' + '  '.join(
            f'{name}: {value:.1f}' for name, value in scalars.items()))

    @staticmethod
    def scalars(saved_bytes: int | None, peak: StepPeak) -> dict[str, float]:
        """The logged figures, in MiB (``saved_bytes``: ``None`` where not measured)."""
        scalars = {} if saved_bytes is None else {'saved_activation_mib': saved_bytes / MIB}
        scalars['step_peak_mib'] = peak.peak_bytes / MIB
        if peak.activation_peak_bytes is not None:
            scalars['activation_peak_mib'] = peak.activation_peak_bytes / MIB
        if peak.reserved_bytes is not None:
            scalars['max_reserved_mib'] = peak.reserved_bytes / MIB
        scalars.update({f'{category}_mib': nbytes / MIB
                        for category, nbytes in peak.by_category.items()})
        return scalars
