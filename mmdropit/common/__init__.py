"""Helpers shared by the core packages and the engine (pure PyTorch, one copy each).

- :mod:`.budget`: a memory budget as the user writes it (``None``, ``0.5``, ``'4GB'``) parsed
  once, and resolved to bytes against a measured baseline;
- :mod:`.training_state`: buffers, RNG streams and tensor values restored after a pass that
  must leave no trace;
- :mod:`.parameters`: the local part of a sharded tensor, an optimizer's parameter order, and
  the device a model runs on;
- :mod:`.timing`: the wall time of some work on a device (a GPU's queue drained around it);
- :mod:`.random_source`: the plugin's own random generator (DropIT's sampling, stochastic
  rounding), apart from the global one;
- :mod:`.files`: files written whole or not at all (a kill leaves the old file);
- :mod:`.units`: byte counts in MiB for messages and tables;
- :mod:`.class_swap`: objects changed in place by swapping their class, and how swaps stack;
- :mod:`.listeners`: listeners that code inside a step notifies while they listen;
- :mod:`.recompute_region`: whether a checkpoint's region is running (compressed modules step
  aside there), and whether its saved tensors are being dropped (DropIT saves placeholders);
- :mod:`.host_copies`: saved tensors kept in pinned host memory (activation offload, and the
  inputs of checkpoints that keep them there).
"""
from .budget import Budget, parse_budget, resolve_budget
from .parameters import local_part, optimizer_params
from .training_state import preserved_training_state, values_restored

__all__ = ['Budget', 'local_part', 'optimizer_params', 'parse_budget',
           'preserved_training_state', 'resolve_budget', 'values_restored']
