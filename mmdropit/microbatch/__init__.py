"""Micro-batching (pure PyTorch): how many parts a loaded batch runs as, so that the step's
measured peak fits a memory budget.

A batch split into micro-batches runs one forward and backward pass per part, its loss weighted
by the part's share, and one optimizer step: the same gradient, a fraction of the activations.
The engine's ``MicroBatchOptimWrapper`` and the benchmark's ``micro-*`` variants both use
:func:`search_split`.

Example:
    >>> micro_batch_sizes(10, 4)
    [3, 3, 2, 2]
"""
from .config import MicroBatchConfig
from .split import BUDGET_HELP, SplitDecision, micro_batch_sizes, search_split, smallest_split

__all__ = ['BUDGET_HELP', 'MicroBatchConfig', 'SplitDecision', 'micro_batch_sizes',
           'search_split', 'smallest_split']
