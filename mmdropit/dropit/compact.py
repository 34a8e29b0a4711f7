"""Compact storage of a sparse saved input: the smaller of bitmask + values or indices + values.

For ``numel`` elements of ``e`` bytes each, of which ``kept`` survive:

===========  ===========================================  ============================
encoding     bytes                                        smaller than dense when
===========  ===========================================  ============================
``bitmask``  ``ceil(numel / 8) + kept * e``               ``kept / numel < 1 - 1/(8e)``
``indices``  ``kept * (4 + e)`` (int32; int64 past 2**31)  ``kept / numel < e / (4 + e)``
``dense``    ``numel * e``                                 --
===========  ===========================================  ============================

At gamma 0.9 an fp32 input shrinks to 0.13 of its size and a bf16/fp16 one to 0.16 (bitmask);
indices win only above gamma ~0.97. Values are stored in memory order (a channels_last input is
not copied to make it contiguous) and in the input's dtype, so autocast's bf16 stays bf16.
When gamma is too small for either encoding to beat dense, the input is saved as it is
(``dense``: no saving, exact gradient).

Example:
    >>> x = torch.tensor([[0.0, 2.0, 0.0, 0.0], [0.0, 0.0, -1.0, 0.0]])
    >>> flat, order = flatten_in_memory_order(x)
    >>> tensors, layout = compress(flat, flat != 0, 1.0, x.shape, order)
    >>> layout.encoding, [t.numel() for t in tensors]
    ('bitmask', [1, 2])
    >>> torch.equal(decompress(tensors, layout), x)
    True
"""
from __future__ import annotations

import torch

from ..kernels import fused_ops
from .layout import CompactLayout
from .quantize import dequantize_kept

_BIT_WEIGHTS: dict[torch.device, torch.Tensor] = {}
_INT32_LIMIT = 2**31 - 1


def _bit_weights(device: torch.device) -> torch.Tensor:
    weights = _BIT_WEIGHTS.get(device)
    if weights is None:
        weights = torch.tensor([1, 2, 4, 8, 16, 32, 64, 128], dtype=torch.uint8, device=device)
        _BIT_WEIGHTS[device] = weights
    return weights


def pack_bits(mask: torch.Tensor) -> torch.Tensor:
    """Pack a boolean tensor into ``ceil(numel / 8)`` bytes (element ``i`` is bit ``i % 8``).

    Example:
        >>> pack_bits(torch.tensor([True, False, True, True, False, False, False, False, True]))
        tensor([13,  1], dtype=torch.uint8)
    """
    flat = mask.reshape(-1).view(torch.uint8)
    remainder = flat.numel() % 8
    if remainder:
        flat = torch.cat([flat, flat.new_zeros(8 - remainder)])
    return (flat.view(-1, 8) * _bit_weights(flat.device)).sum(1, dtype=torch.uint8)


def unpack_bits(packed: torch.Tensor, numel: int) -> torch.Tensor:
    """Inverse of :func:`pack_bits`: the first ``numel`` bits as a flat boolean tensor.

    Example:
        >>> unpack_bits(torch.tensor([13, 1], dtype=torch.uint8), 9).int().tolist()
        [1, 0, 1, 1, 0, 0, 0, 0, 1]
    """
    bits = packed.unsqueeze(1).bitwise_and(_bit_weights(packed.device)).ne(0)
    return bits.view(-1)[:numel]


def encoded_bytes(numel: int, kept: int, element_size: int) -> dict[str, int]:
    """Bytes each encoding needs for ``kept`` of ``numel`` elements of ``element_size`` bytes.

    Example:
        >>> encoded_bytes(1000, 100, 4)
        {'bitmask': 525, 'indices': 800, 'dense': 4000}
    """
    index_size = 4 if numel <= _INT32_LIMIT else 8
    return {
        'bitmask': (numel + 7) // 8 + kept * element_size,
        'indices': kept * (index_size + element_size),
        'dense': numel * element_size,
    }


def smaller_encoding(numel: int, kept: int, element_size: int) -> str:
    """``'bitmask'`` or ``'indices'``, whichever stores ``kept`` of ``numel`` elements in fewer
    bytes (the bitmask on a tie).

    Example:
        >>> smaller_encoding(1000, 100, 4), smaller_encoding(1000, 10, 4)
        ('bitmask', 'indices')
    """
    sizes = encoded_bytes(numel, kept, element_size)
    return 'bitmask' if sizes['bitmask'] <= sizes['indices'] else 'indices'


def _memory_order(x: torch.Tensor) -> tuple[int, ...] | None:
    if x.is_contiguous():
        return None
    order = tuple(sorted(range(x.dim()), key=lambda dim: -x.stride(dim)))
    if x.permute(order).is_contiguous():
        return order
    return None


def flatten_in_memory_order(x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, ...] | None]:
    """A flat view of ``x`` in the order its elements lie in memory (a copy only when ``x`` is
    neither contiguous nor a permutation of a contiguous tensor, e.g. a strided slice)."""
    order = _memory_order(x)
    if order is None:
        return x.contiguous().view(-1), None
    return x.permute(order).reshape(-1), order


def worth_compressing(gamma: float, element_size: int) -> bool:
    """Whether dropping a ``gamma`` share of elements of ``element_size`` bytes can be stored in
    fewer bytes than the dense tensor (false for gamma <= 1/32 in fp32, 1/16 in bf16/fp16).

    Example:
        >>> worth_compressing(0.9, 4), worth_compressing(0.02, 4)
        (True, False)
    """
    numel = 1 << 20
    kept = numel - int(gamma * numel)
    sizes = encoded_bytes(numel, kept, element_size)
    return min(sizes['bitmask'], sizes['indices']) < sizes['dense']


def index_dtype(numel: int) -> torch.dtype:
    """The dtype of the ``indices`` encoding: int32, or int64 past 2**31 elements."""
    return torch.int32 if numel <= _INT32_LIMIT else torch.int64


def kept_indices(keep: torch.Tensor, kept: int) -> torch.Tensor:
    """The positions of the ``kept`` true elements of the flat mask ``keep``, ascending:
    ``keep.nonzero()`` for a count known beforehand (``nonzero_static``), which reads nothing
    back from the device (``nonzero`` waits for the GPU to learn its output's size).

    Example:
        >>> kept_indices(torch.tensor([False, True, True, False, True]), 3)
        tensor([1, 2, 4])
    """
    return torch.nonzero_static(keep, size=kept).view(-1)


def encode(flat: torch.Tensor, keep: torch.Tensor, scale: float, encoding: str,
           kept: int | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The kept elements of ``flat`` as ``(bitmask, values)`` or ``(indices, values)``, the
    values in memory order and multiplied by ``scale``.

    ``kept``, when given, is the number of true elements of ``keep`` (a fixed-count strategy's):
    then nothing is read back from the device; without it ``nonzero`` counts them (a host sync
    on a GPU)."""
    index = keep.nonzero().squeeze(1) if kept is None else kept_indices(keep, kept)
    return _encode_index(flat, keep, index, scale, encoding)


def _encode_index(flat: torch.Tensor, keep: torch.Tensor, index: torch.Tensor, scale: float,
                  encoding: str) -> tuple[torch.Tensor, torch.Tensor]:
    values = flat.index_select(0, index)
    if scale != 1.0:
        values.mul_(scale)
    if encoding == 'bitmask':
        return pack_bits(keep), values
    return index.to(index_dtype(flat.numel())), values


def compress(flat: torch.Tensor, keep: torch.Tensor, scale: float, shape: torch.Size,
             memory_order: tuple[int, ...] | None) -> tuple[tuple[torch.Tensor, ...],
                                                           CompactLayout]:
    """Encode the kept elements of ``flat`` as bitmask + values or indices + values, whichever
    is smaller.

    Args:
        flat: The input flattened in memory order (:func:`flatten_in_memory_order`).
        keep: Boolean mask over ``flat``.
        scale: Factor applied to the kept values (``numel / kept`` for ``random``).
        shape: Shape of the original tensor.
        memory_order: The permutation returned by :func:`flatten_in_memory_order`.

    Returns:
        ``(tensors, layout)``: the tensors to save for backward and how to read them back.

    The count kept is read from ``keep`` (``nonzero``: a host sync on a GPU), as a mask of
    data-dependent count (``mink_approx``) needs; :func:`encode` takes a known count instead.
    """
    index = keep.nonzero().squeeze(1)
    encoding = smaller_encoding(flat.numel(), index.numel(), flat.element_size())
    tensors = _encode_index(flat, keep, index, scale, encoding)
    nbytes = sum(t.numel() * t.element_size() for t in tensors)
    return tensors, CompactLayout(shape, flat.dtype, encoding, memory_order, nbytes)


def dense_layout(x: torch.Tensor) -> CompactLayout:
    """The layout of an input saved as it is (when compact storage would not be smaller)."""
    return CompactLayout(x.shape, x.dtype, 'dense', None, x.numel() * x.element_size())


def decompress(tensors: tuple[torch.Tensor, ...], layout: CompactLayout) -> torch.Tensor:
    """Rebuild the dense tensor (dropped elements are zero) in the original memory layout."""
    if layout.encoding == 'dense':
        return tensors[0]
    first, values = dequantize_kept(tensors, layout)
    return restore_shape(scatter_kept(first, values, layout.shape.numel(), layout.encoding),
                         layout)


def scatter_kept(first: torch.Tensor, values: torch.Tensor, numel: int,
                 encoding: str) -> torch.Tensor:
    """The flat dense tensor of ``numel`` elements that :func:`encode` encoded (dropped
    elements are zero); one fused pass where :mod:`mmdropit.kernels` can run."""
    fused = fused_ops(values) if encoding == 'bitmask' else None
    if fused is not None:
        return fused.scatter_bitmask(first, values, numel)
    flat = values.new_zeros(numel)
    if encoding == 'bitmask':
        flat.masked_scatter_(unpack_bits(first, numel), values)
    else:
        flat.index_copy_(0, first.long(), values)
    return flat


def restore_shape(flat: torch.Tensor, layout: CompactLayout) -> torch.Tensor:
    """``flat`` (in memory order) viewed with the original shape and memory layout."""
    if layout.memory_order is None:
        return flat.view(layout.shape)
    order = layout.memory_order
    permuted_shape = [layout.shape[dim] for dim in order]
    inverse = sorted(range(len(order)), key=order.__getitem__)
    return flat.view(permuted_shape).permute(inverse)
