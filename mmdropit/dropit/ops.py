"""DropIT's selection and storage as PyTorch custom operators, so ``torch.compile`` traces a
DropIT layer whole.

Selecting the kept elements (``kthvalue``, ``nonzero``) has data-dependent shapes, which
``torch.compile`` cannot trace: each DropIT layer used to end a graph. For the fixed-count
strategies (``mink``, ``random``: :data:`~.strategies.FIXED_COUNT`) the saved tensors' shapes
follow from the input's shape and gamma alone, so the selection and the encoding run inside one
custom operator, ``mmdropit::keep``, and the rebuilding inside another,
``mmdropit::unkeep``, each with a fake (meta) implementation that gives those shapes without
running. Compiled graphs call the operators as opaque kernels; eager code calls the same
functions directly (:func:`~mmdropit.common.custom_operators.operator_or_body`: the dispatcher
costs ~100 us a call), so both select the same elements.

``mink_approx`` keeps a data-dependent count: it is not an operator (a graph break per layer
under ``torch.compile``); :func:`keep_sampled` selects and encodes it, reading the count back
(one host sync per layer on a GPU, fused or eager). The fixed-count strategies' eager path reads
nothing back (:func:`~.compact.encode` is given the count), as their fused kernels do not.

The operators run DropIT's fused kernels (:mod:`mmdropit.kernels`: the C++ extension on the
CPU when it is built, Triton kernels on a GPU): a few parallel passes instead of the eager
path's 6-8, with bit-identical results for ``mink`` (its exact threshold does not draw the
sample the eager path uses to find it). The fused ``random`` makes the same select and write
over a random key per element (a counter-based stream from a seed drawn from the plugin's
generator; the same keys on both devices), where the eager path draws a permutation: both keep
a set drawn uniformly without replacement, different sets for one generator state.

Example:
    >>> x = torch.randn(4, 16)
    >>> tensors, layout = keep_fixed(x.reshape(-1), 0.75, 'mink', x.shape, None)
    >>> layout.encoding, [tuple(t.shape) for t in tensors]
    ('bitmask', [(8,), (16,)])
    >>> rebuilt = unkeep(tensors, layout)
    >>> int(rebuilt.count_nonzero()), torch.equal(rebuilt[rebuilt != 0], x[rebuilt != 0])
    (16, True)
"""
from __future__ import annotations

import warnings

import torch
from torch.library import custom_op, register_fake

from ..common.custom_operators import operator_or_body, through_dispatcher
from ..common.random_source import generator
from ..common.recompute_region import saved_tensors_dropped
from ..kernels import fused_ops
from .compact import (CompactLayout, compress, dense_layout, encode, encoded_bytes, index_dtype,
                      restore_shape, scatter_kept, smaller_encoding, worth_compressing)
from .quantize import dequantize_kept
from .strategies import (FIXED_COUNT, SAMPLE_SIZE, counted_strategy, host_reads_are_free,
                         kept_count, random_scale, sampled_threshold, select)

NODE_STRATEGIES = frozenset({'mink', 'random'})
"""Strategies whose selection a DropIT Linear's or convolution's C++ autograd node makes itself
in the bitmask encoding (:func:`~mmdropit.kernels.fused_linear_node`); the node is given the
others' selections, made by the layer."""


def _fused_keep(flat: torch.Tensor, strategy: str, kept: int,
                bitmask: bool) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The fused kernels' encoded selection of ``kept`` elements of ``flat`` by ``strategy``
    (``'mink'`` or ``'random'``), or ``None`` where none can run on ``flat``."""
    fused = fused_ops(flat)
    if fused is None:
        return None
    if strategy == 'mink':
        return fused.keep_topk(flat, kept, bitmask)
    return fused.keep_random(flat, kept, bitmask, random_scale(flat.numel(), kept),
                             generator(flat.device))


def _keep(flat: torch.Tensor, gamma: float, strategy: str,
          encoding: str) -> tuple[torch.Tensor, torch.Tensor]:
    kept = kept_count(flat.numel(), gamma)
    fused = _fused_keep(flat, strategy, kept, encoding == 'bitmask')
    if fused is not None:
        return fused
    keep, scale = select(strategy, flat, gamma)
    return encode(flat, keep, scale, encoding, kept)


custom_op('mmdropit::keep', _keep, mutates_args=())


@register_fake('mmdropit::keep')
def _keep_shapes(flat, gamma, strategy, encoding):
    numel = flat.numel()
    kept = kept_count(numel, gamma)
    first = (flat.new_empty(((numel + 7) // 8,), dtype=torch.uint8) if encoding == 'bitmask'
             else flat.new_empty((kept,), dtype=index_dtype(numel)))
    return first, flat.new_empty((kept,))


def _unkeep(first: torch.Tensor, values: torch.Tensor, numel: int,
            encoding: str) -> torch.Tensor:
    return scatter_kept(first, values, numel, encoding)


custom_op('mmdropit::unkeep', _unkeep, mutates_args=())


@register_fake('mmdropit::unkeep')
def _unkeep_shape(first, values, numel, encoding):
    return values.new_empty((numel,))


def keep_fixed(flat: torch.Tensor, gamma: float, strategy: str, shape: torch.Size,
               memory_order: tuple[int, ...] | None,
               placeholders: bool = False) -> tuple[tuple[torch.Tensor, ...], CompactLayout]:
    """Select and encode the kept elements of ``flat`` with a fixed-count strategy, in the
    smaller encoding for that count (as :func:`~.compact.compress` does for a mask).

    Args:
        flat: The input flattened in memory order.
        gamma: Share of elements dropped.
        strategy: ``'mink'`` or ``'random'``.
        shape: Shape of the original tensor.
        memory_order: The permutation of :func:`~.compact.flatten_in_memory_order`.
        placeholders: Return uninitialised tensors of the right shapes without selecting (in a
            checkpoint's first forward pass, whose saved tensors are dropped; the
            recomputation selects).
    """
    numel, size = flat.numel(), flat.element_size()
    kept = kept_count(numel, gamma)
    encoding = smaller_encoding(numel, kept, size)
    keep = _keep_shapes if placeholders else operator_or_body(torch.ops.mmdropit.keep, _keep)
    tensors = keep(flat, gamma, strategy, encoding)
    return tensors, _layout(flat, kept, encoding, shape, memory_order)


def _layout(flat: torch.Tensor, kept: int, encoding: str, shape: torch.Size,
            memory_order: tuple[int, ...] | None) -> CompactLayout:
    nbytes = encoded_bytes(flat.numel(), kept, flat.element_size())[encoding]
    return CompactLayout(shape, flat.dtype, encoding, memory_order, nbytes)


def keep_sampled(flat: torch.Tensor, gamma: float, shape: torch.Size,
                 memory_order: tuple[int, ...] | None) -> tuple[tuple[torch.Tensor, ...],
                                                                CompactLayout]:
    """``mink_approx``: keep the elements above a sampled threshold, encoded in the smaller
    encoding for their (data-dependent) count; fused where :mod:`mmdropit.kernels` can run.

    Args are those of :func:`keep_fixed` (without the strategy).
    """
    if flat.numel() <= SAMPLE_SIZE:  # no sample: the exact min-k, as the strategy says
        return keep_fixed(flat, gamma, 'mink', shape, memory_order)
    fused = fused_ops(flat)
    if fused is None:
        keep, scale = select('mink_approx', flat, gamma)
        return compress(flat, keep, scale, shape, memory_order)
    threshold = sampled_threshold(flat, gamma)
    if not flat.is_cuda:  # the CPU kernels take a number; the GPU's read it on the device
        threshold = float(threshold)
    counts = fused.above_counts(flat, threshold)
    kept = int(counts.sum())
    encoding = smaller_encoding(flat.numel(), kept, flat.element_size())
    tensors = fused.write_above(flat, threshold, counts, encoding == 'bitmask')
    return tensors, _layout(flat, kept, encoding, shape, memory_order)


def unkeep(tensors: tuple[torch.Tensor, ...], layout: CompactLayout) -> torch.Tensor:
    """Rebuild the dense input (dropped elements zero) in its shape and memory layout."""
    if layout.encoding == 'dense':
        return tensors[0]
    first, values = dequantize_kept(tensors, layout)
    unkeep_op = operator_or_body(torch.ops.mmdropit.unkeep, _unkeep)
    flat = unkeep_op(first, values, layout.shape.numel(), layout.encoding)
    return restore_shape(flat, layout)


def unkeep_rows(tensors: tuple[torch.Tensor, ...], layout: CompactLayout) -> torch.Tensor:
    """:func:`unkeep` as the matrix a weight gradient reads: one row per position (every
    dimension but the last), the last dimension across (one view of the rebuilt tensor, where
    :func:`unkeep` and a reshape would make two)."""
    if (layout.encoding == 'dense' or layout.memory_order is not None
            or layout.value_bits is not None or through_dispatcher()):
        x = unkeep(tensors, layout)
        return x.reshape(-1, x.shape[-1])
    first, values = tensors
    return _unkeep(first, values, layout.shape.numel(), layout.encoding).view(
        -1, layout.shape[-1])


class SavePlan:
    """How a layer saves a contiguous input of one shape, dtype and device at one gamma and
    strategy: whether compact storage is smaller, the count a fixed-count selection keeps, its
    encoding and layout, worked out once and reused while these stay the same.

    A DropIT layer keeps its plan (:attr:`~.state.DropITState.save_plan`): building these
    afresh at every call cost a few microseconds of host time a layer, which a host-bound GPU
    step pays one for one. :meth:`keep` selects and encodes exactly as :func:`keep_fixed` does,
    with the strategy itself or, for ``mink_approx``, with ``mink``
    (:func:`~.strategies.counted_strategy`): what it keeps on an input of at most
    :data:`~.strategies.SAMPLE_SIZE` elements and inside a plain checkpoint. ``fixed`` says
    whether the count follows from the shape (false for ``mink_approx`` on a larger input).

    Example:
        >>> x = torch.randn(4, 16)
        >>> plan = SavePlan(x, 0.75, 'mink')
        >>> plan.kept, plan.encoding, plan.layout.nbytes
        (16, 'bitmask', 72)
        >>> tensors = plan.keep(x.view(-1))
        >>> [tuple(t.shape) for t in tensors]
        [(8,), (16,)]
    """

    __slots__ = ('key', 'gamma', 'strategy', 'counted', 'compress', 'fixed', 'numel', 'kept',
                 'encoding', 'bitmask', 'layout', 'workspace', 'fused_node')

    def __init__(self, x: torch.Tensor, gamma: float, strategy: str) -> None:
        self.key = self.key_of(x, gamma, strategy)
        self.gamma, self.strategy = gamma, strategy
        self.counted = counted_strategy(strategy)
        numel, size = x.numel(), x.element_size()
        self.compress = worth_compressing(gamma, size)
        self.fixed = strategy in FIXED_COUNT or numel <= SAMPLE_SIZE  # mink_approx: as mink
        self.numel = numel
        self.kept = kept_count(numel, gamma)
        self.encoding = smaller_encoding(numel, self.kept, size)
        self.bitmask = self.encoding == 'bitmask'
        self.workspace = numel * size  # backward rebuilds the dense input
        # what the C++ nodes of DropIT's Linear and convolution select themselves
        # (kernels.fused_*_node; they are given any other selection)
        self.fused_node = (self.compress and self.bitmask and self.fixed
                           and self.counted in NODE_STRATEGIES)
        if not self.compress:
            self.layout = dense_layout(x)
            return
        self.layout = CompactLayout(x.shape, x.dtype, self.encoding, None,
                                    encoded_bytes(numel, self.kept, size)[self.encoding])
        if not self.fixed and not host_reads_are_free(x.device):
            warnings.warn("DropIT strategy 'mink_approx' reads its kept count back from "
                          f'the {x.device.type} device once a layer, which stalls the step; '
                          "strategy='mink' selects exactly without reading anything back.",
                          stacklevel=2)

    @staticmethod
    def key_of(x: torch.Tensor, gamma: float, strategy: str) -> tuple:
        """What a plan depends on; a plan whose key differs is made again."""
        return x.shape, x.dtype, x.device, gamma, strategy

    def keep(self, flat: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The fixed-count selection of ``flat`` (the input flattened) by :attr:`counted`,
        encoded: what :func:`keep_fixed` returns, placeholders in a checkpoint's first pass
        included."""
        if saved_tensors_dropped():
            return _keep_shapes(flat, self.gamma, self.counted, self.encoding)
        if through_dispatcher():
            return torch.ops.mmdropit.keep(flat, self.gamma, self.counted, self.encoding)
        fused = _fused_keep(flat, self.counted, self.kept, self.bitmask)
        if fused is not None:
            return fused
        keep, scale = select(self.counted, flat, self.gamma)
        return encode(flat, keep, scale, self.encoding, self.kept)
