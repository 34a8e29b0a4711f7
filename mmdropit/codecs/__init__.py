"""Saved-tensor codecs (pure PyTorch): smaller forms of what autograd keeps for backward.

- :mod:`.int8`: per-group int8 with a float32 scale per 32 values (Mesa-style);
- :mod:`.low_bit`: per-group 4 or 2 bits with a float32 minimum and step per 32 values and
  stochastic rounding (ActNN / GACT-style, unbiased);
- :mod:`.bits`: both behind one entry by bit width; DropIT's ``value_bits`` stores its kept
  values with it;
- :mod:`.derivative_codes`: GELU / SiLU that save a 4-bit code of their piecewise-constant
  derivative instead of their input (few-bit backward);
- :mod:`.activations`: normalisation, activation and attention modules converted in place so
  that what they save is stored in 8, 4 or 2 bits (GELU / SiLU optionally as derivative codes);
- :mod:`.saved_views`: a saved view rebuilt with its strides (a compiled backward asserts them);
- :mod:`.rebuilt_activations`: exact: the layer after a GELU / SiLU keeps a note to rebuild the
  activation's output from its input (kept anyway) instead of a copy;
- :mod:`.config`: :class:`CompressionConfig`, the technique's configuration, checked once and
  applied in one call (:func:`compress_activations` for a model in hand).

GACT's adaptive bits (a width per layer, from its measured gradient error, across these codecs
and DropIT's kept values) are :func:`mmdropit.dropit.adapt_bits`.
"""
from .activations import (DEFAULT_TYPES, CompressedActivations, compressible_modules,
                          restore_activations)
from .bits import BITS, check_bits, dequantize_values, quantize_values, quantized_values_bytes
from .config import AppliedCompression, CompressionConfig, compress_activations
from .int8 import GROUP, dequantize, quantize, quantized_bytes
from .rebuilt_activations import (AppliedRebuilt, RebuiltActivationsConfig, rebuild_activations,
                                  rebuildable_activations)

__all__ = ['AppliedCompression', 'AppliedRebuilt', 'BITS', 'CompressedActivations',
           'CompressionConfig',
           'DEFAULT_TYPES', 'GROUP', 'check_bits',
           'compress_activations', 'compressible_modules', 'dequantize', 'dequantize_values',
           'quantize', 'quantize_values', 'quantized_bytes', 'quantized_values_bytes',
           'RebuiltActivationsConfig', 'rebuild_activations', 'rebuildable_activations',
           'restore_activations']
