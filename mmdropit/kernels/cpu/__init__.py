"""The fused CPU kernels (``torch.ops.mmdropit_cpu``) of DropIT, the lean activations and the
integer codecs, with their build and loading.

- ``keep_topk(flat, kept, bitmask)``: exact min-k (a radix select on the bit pattern of
  ``|x|``) and the encoded kept elements, ties first in memory order as in the eager ``mink``;
- ``keep_random(flat, kept, bitmask, scale, generator)``: ``random``'s fixed count drawn
  uniformly without replacement (the same select over a counter-based random key per element,
  keyed by one draw from ``generator``), encoded, the kept values times ``scale``;
- ``above_counts(flat, threshold)`` and ``write_above(flat, threshold, counts, bitmask)``: the
  elements above ``mink_approx``'s sampled threshold, counted per chunk, then encoded;
- ``scatter_bitmask(bitmask, values, numel)``: the dense input rebuilt in one pass;
- ``dropit_linear(x, weight, bias, kept)``: a DropIT Linear's forward and backward as one C++
  autograd node (fused ``mink``, bitmask encoding);
- ``pack_between`` / ``where_bits``: the lean activations' 1-bit masks;
- ``bucket_codes`` / ``scale_by_codes``: the lean GELU / SiLU's 4-bit derivative codes, and
  the gradient scaled by their table;
- ``quantize_int8`` / ``dequantize_int8`` and ``quantize_low`` / ``dequantize_low``: the int8
  and the 4- and 2-bit codes of saved activations, one pass each way.

Example:
    >>> flat = torch.tensor([0.1, -3.0, 0.5, 2.0, -0.2, 0.05, 1.0, -0.7, 0.3, 4.0])
    >>> if usable(flat):
    ...     bits, values = torch.ops.mmdropit_cpu.keep_topk(flat, 3, True)
    ...     rebuilt = torch.ops.mmdropit_cpu.scatter_bitmask(bits, values, 10)
    ... else:  # not built: the same tensors from the eager path
    ...     values, rebuilt = flat[[1, 3, 9]], flat * (flat.abs() >= 2)
    >>> values.tolist(), rebuilt.count_nonzero().item()
    ([-3.0, 2.0, 4.0], 3)
"""
import torch  # noqa: F401  (the doctest's namespace)

from .library import build_directory, load, usable

__all__ = ['build_directory', 'load', 'usable']
