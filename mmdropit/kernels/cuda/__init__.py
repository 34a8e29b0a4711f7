"""DropIT's fused GPU kernels (Triton), with the operators of the CPU extension:

- ``keep_topk(flat, kept, bitmask)``, ``keep_random(flat, kept, bitmask, scale, generator)``,
  ``above_counts(flat, threshold)``,
  ``write_above(flat, threshold, counts, bitmask)``, ``scatter_bitmask(bits, values, numel)``
  in :mod:`.dropit_kernels`, imported by :func:`load` the first time a DropIT layer runs on a
  GPU (Triton is not imported before);
- the integer codecs' ``quantize_int8``, ``dequantize_int8``, ``quantize_low``,
  ``dequantize_low`` in :mod:`.codec_kernels`, imported by :func:`load_codecs` the first time a
  codec runs on a GPU;
- :func:`node_ready`: the selection and mask kernels registered as the CPU library's operators'
  CUDA implementations, so the C++ autograd nodes (DropIT's Linear and convolution, the lean
  ReLU and Hardtanh) run on a GPU (:mod:`.nodes`).

Example:
    >>> usable(torch.randn(4))
    False
"""
import torch  # noqa: F401  (the doctest's namespace)

from .library import DTYPES, codecs_usable, load, load_codecs, usable
from .nodes import node_ready

__all__ = ['DTYPES', 'codecs_usable', 'load', 'load_codecs', 'node_ready', 'usable']
