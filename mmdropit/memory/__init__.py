"""Memory meters (pure PyTorch): saved-activation bytes, step peaks by category, reports.

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
from .peak import CATEGORIES, StepPeak, StepPeakMeter
from .plot import plot_ratios, plot_tradeoff
from .report import Measurement, compare, markdown_table, write_json
from .saved import SavedActivations, SavedTensorMeter, measure_saved_activations
from .step_benchmark import benchmark_workload
from .variants import BASELINE, VARIANTS, Variant, Workload, register_variant

__all__ = [
    'BASELINE', 'CATEGORIES', 'Measurement', 'SavedActivations', 'SavedTensorMeter', 'StepPeak',
    'StepPeakMeter', 'VARIANTS', 'Variant', 'Workload', 'benchmark_workload', 'compare',
    'markdown_table', 'measure_saved_activations', 'plot_ratios', 'plot_tradeoff',
    'register_variant',
    'write_json',
]
