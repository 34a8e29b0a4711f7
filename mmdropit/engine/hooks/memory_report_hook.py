"""Log what a training step really holds in memory: saved activations and the step peak.

Example config::

    custom_hooks = [dict(type='MemoryReportHook', interval=100)]
"""
from __future__ import annotations

from mmengine.registry import HOOKS

from ...common.units import MIB
from ...errors import ConfigError
from ...memory import SavedTensorMeter, StepPeak, StepPeakMeter
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
        self._meters: tuple[SavedTensorMeter, StepPeakMeter] | None = None
        self.last_scalars: dict[str, float] = {}

    def _measures(self, runner) -> bool:
        return runner.iter == 0 or (runner.iter + 1) % self.interval == 0

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        if not self._measures(runner):
            return
        optimizer = getattr(runner.optim_wrapper, 'optimizer', None)
        saved = SavedTensorMeter(runner.model)
        peak = StepPeakMeter(runner.model, optimizer=optimizer, reset_peak=False)
        peak.start()
        saved.start()
        self._meters = (saved, peak)

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if self._meters is not None:
            self._report(runner)
        super().after_train_iter(runner, batch_idx, data_batch, outputs)

    def summary(self, runner) -> str | None:
        if not self.last_scalars:
            return None
        every = 'iteration' if self.interval == 1 else f'{self.interval} iterations'
        return (f'iteration {runner.iter + 1}: step peak '
                f'{self.last_scalars["step_peak_mib"]:.1f} MiB, saved activations '
                f'{self.last_scalars["saved_activation_mib"]:.1f} MiB (measured again every '
                f'{every})')

    def _report(self, runner) -> None:
        """Stop the meters of this iteration and log and add their figures."""
        saved_meter, peak_meter = self._meters
        self._meters = None
        saved = saved_meter.stop()
        peak = peak_meter.stop()
        scalars = self.scalars(saved.total_bytes, peak)
        self.last_scalars = scalars
        runner.visualizer.add_scalars(
            {f'memory/{name}': value for name, value in scalars.items()}, step=runner.iter + 1)
        runner.logger.info(f'memory at iter {runner.iter + 1}: ' + '  '.join(
            f'{name}: {value:.1f}' for name, value in scalars.items()))

    @staticmethod
    def scalars(saved_bytes: int, peak: StepPeak) -> dict[str, float]:
        """The logged figures, in MiB."""
        scalars = {'saved_activation_mib': saved_bytes / MIB,
                   'step_peak_mib': peak.peak_bytes / MIB}
        if peak.activation_peak_bytes is not None:
            scalars['activation_peak_mib'] = peak.activation_peak_bytes / MIB
        if peak.reserved_bytes is not None:
            scalars['max_reserved_mib'] = peak.reserved_bytes / MIB
        scalars.update({f'{category}_mib': nbytes / MIB
                        for category, nbytes in peak.by_category.items()})
        return scalars
