"""Optim wrappers: micro-batching under a memory budget, and mixed precision on any device."""
from .autocast_switch import AutocastSwitch
from .micro_batch_optim_wrapper import MicroBatchOptimWrapper
from .micro_batching import MicroBatching, MicroBatchTrainStep
from .mixed_precision_optim_wrapper import MixedPrecisionOptimWrapper

__all__ = ['AutocastSwitch', 'MicroBatchOptimWrapper', 'MicroBatchTrainStep', 'MicroBatching',
           'MixedPrecisionOptimWrapper']
