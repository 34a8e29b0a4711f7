"""``MicroBatchOptimWrapper``: MMEngine's ``OptimWrapper`` that splits each batch in memory.

Config example::

    optim_wrapper = dict(
        type='MicroBatchOptimWrapper', micro_batches=4,      # or memory_budget='6GB' / 0.5
        optimizer=dict(type='AdamW', lr=5e-4, weight_decay=0.05))

With ``--amp`` (``tools/train.py``) it becomes a :class:`MixedPrecisionOptimWrapper` with the same
micro-batching settings.
"""
from __future__ import annotations

from mmengine.optim import OptimWrapper
from mmengine.registry import OPTIM_WRAPPERS

from ...microbatch import MicroBatchConfig
from .micro_batching import MicroBatching


@OPTIM_WRAPPERS.register_module()
class MicroBatchOptimWrapper(MicroBatching, OptimWrapper):
    """An ``OptimWrapper`` that runs each loaded batch as several micro-batches and steps once.

    Args:
        micro_batches: Split every batch into this many micro-batches (sizes differ by at most
            one sample); more micro-batches than samples in the first batch is an error.
        memory_budget: Instead of ``micro_batches``: on the first iteration, measure trial
            passes and take the fewest micro-batches whose peak fits. A fraction (of the peak
            of the undivided step, e.g. ``0.5``) or a size (``'6GB'``, ``'512MiB'``, or bytes).
            The peak counts parameters, gradients, buffers, optimizer state (including what the
            first step creates), activations and temporaries. Hooks that change the model before
            the first iteration (``DropITHook``, ``CheckpointPlanHook``) are in effect.
        **kwargs: ``OptimWrapper`` arguments (``optimizer``, ``accumulative_counts``,
            ``clip_grad``).
    """

    def __init__(self, micro_batches: int | None = None, memory_budget: object = None,
                 **kwargs) -> None:
        super().__init__(**kwargs)
        self.configure_micro_batching(MicroBatchConfig(micro_batches, memory_budget))
