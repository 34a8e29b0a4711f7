"""Saved-tensor codecs (pure PyTorch): smaller forms of what autograd keeps for backward.

- :mod:`.int8`: per-group int8 with a float32 scale per 32 values (Mesa-style); DropIT's
  ``value_bits=8`` stores its kept values with it.
- :mod:`.activations`: :func:`compress_activations` converts normalisation, activation and
  attention modules in place so that what they save is stored with the int8 codec.

Not built yet: 4- and 2-bit codecs with stochastic rounding (ActNN / GACT), GACT's adaptive
bits, lean GELU / SiLU.
"""
from .activations import (DEFAULT_TYPES, CompressedActivations, compress_activations,
                          restore_activations)
from .int8 import GROUP, dequantize, quantize, quantized_bytes

__all__ = ['CompressedActivations', 'DEFAULT_TYPES', 'GROUP', 'compress_activations',
           'dequantize', 'quantize', 'quantized_bytes', 'restore_activations']
