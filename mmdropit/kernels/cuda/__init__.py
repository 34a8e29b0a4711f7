"""DropIT's fused GPU kernels (Triton), with the operators of the CPU extension:

- ``keep_topk(flat, kept, bitmask)``, ``above_counts(flat, threshold)``,
  ``write_above(flat, threshold, counts, bitmask)``, ``scatter_bitmask(bits, values, numel)``
  in :mod:`.dropit_kernels`, imported by :func:`load` the first time a DropIT layer runs on a
  GPU (Triton is not imported before).

Example:
    >>> usable(torch.randn(4))
    False
"""
import torch  # noqa: F401  (the doctest's namespace)

from .library import DTYPES, load, usable

__all__ = ['DTYPES', 'load', 'usable']
