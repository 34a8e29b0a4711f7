"""Memory meters (pure PyTorch): saved-activation bytes, step peaks by category, trial peaks.

- :class:`SavedTensorMeter`: the bytes autograd keeps for backward, each storage once;
- :class:`StepPeakMeter`: the peak of a training step, by category (MemTracker on CPU, the
  allocator's counters on CUDA);
- :class:`ProfiledPeakMeter`: the peak above a region's start from the profiler's memory events
  (works around compiled code); :class:`CompiledStepPeakMeter`: a whole step's peak from it (on
  CUDA from the allocator), compiled or not;
- :func:`trial_peak` and :func:`trial_seconds`: the peak and the time of a trial forward and
  backward pass, training state put back; :func:`trial_peaks`: its peaks with and without
  gradients held, from one pass on CPU.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from mmdropit.memory import SavedTensorMeter
    >>> net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32))
    >>> with SavedTensorMeter(net) as meter:
    ...     net(torch.randn(8, 64)).sum().backward()
    >>> meter.result.total_bytes
    6144
"""
from .compiled_peak import CompiledStepPeakMeter
from .peak import CATEGORIES, StepPeak, StepPeakMeter
from .profiled_peak import ProfiledPeak, ProfiledPeakMeter
from .saved import SavedActivations, SavedTensorMeter, measure_saved_activations
from .trial_peak import (TrialPeaks, pending_optimizer_state_bytes, state_bytes, trial_peak,
                         trial_peaks, trial_seconds)

__all__ = [
    'CATEGORIES', 'CompiledStepPeakMeter', 'ProfiledPeak', 'ProfiledPeakMeter',
    'SavedActivations', 'SavedTensorMeter', 'StepPeak', 'StepPeakMeter',
    'TrialPeaks', 'measure_saved_activations', 'pending_optimizer_state_bytes', 'state_bytes',
    'trial_peak', 'trial_peaks', 'trial_seconds',
]
