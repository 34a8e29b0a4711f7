"""DropIT's fused GPU kernels, written in Triton: the same operators as the CPU extension's
(``keep_topk``, ``above_counts``, ``write_above``, ``scatter_bitmask``), giving bit-identical
tensors to the eager path.

The input is cut into blocks of :data:`BLOCK` elements, one Triton program each.

- ``keep_topk`` (``mink``): a sample of :data:`SAMPLE` elements at fixed pseudo-random places
  brackets the exact threshold; one pass counts the elements below the bracket per block and
  collects those inside it (a few percent), where ``torch.kthvalue`` finds the threshold. Inputs
  of fewer than ``8 * SAMPLE`` elements, and a bracket that misses, use ``torch.kthvalue`` on
  the whole magnitude. A second pass counts, per block, the elements above the threshold and
  those equal to it; a third writes the bitmask (or indices) and the kept values, with the ties
  that fill the count taken first in memory order, as the eager ``mink`` does.
- ``above_counts`` / ``write_above`` (``mink_approx``): the count and write passes with a given
  threshold and no ties kept.
- ``scatter_bitmask`` (backward): per-block popcounts of the bitmask, then one pass that writes
  every element of the dense input (kept values or zero).

Offsets between blocks are prefix sums over the per-block counts (``torch.cumsum``); the only
host synchronisation of ``keep_topk`` is the bracket check. Inputs of 2**31 elements or more,
and float64 inputs, stay on the eager path (:func:`~.library.usable`).

Example (on a GPU; with ``TRITON_INTERPRET=1``, as the tests run it, on CPU tensors too):
    >>> device = 'cuda' if torch.cuda.is_available() else 'cpu'
    >>> flat = torch.tensor([0.1, -3.0, 0.5, 2.0, -0.2, 0.05, 1.0, -0.7, 0.3, 4.0], device=device)
    >>> bits, values = keep_topk(flat, 3, True)
    >>> values.tolist(), scatter_bitmask(bits, values, 10).count_nonzero().item()
    ([-3.0, 2.0, 4.0], 3)
"""
from __future__ import annotations

import math

import torch
import triton
import triton.language as tl

BLOCK = 1024
"""Elements per Triton program (a multiple of 8: one program writes whole bitmask bytes)."""
SAMPLE = 16384
"""Elements sampled to bracket ``mink``'s threshold."""
_HASH = 2654435761  # Knuth's multiplicative hash: the sample's fixed pseudo-random places


@triton.jit
def _band_kernel(x_ptr, numel, low, high, below_ptr, band_ptr, band_fill_ptr, band_capacity,
                 BLOCK: tl.constexpr):
    """Per block: how many magnitudes are <= ``low``; those in ``(low, high]`` are appended to
    ``band`` (in any order: only their multiset matters) while it has room."""
    pid = tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < numel
    magnitude = tl.abs(tl.load(x_ptr + offsets, mask=inside, other=0).to(tl.float32))
    below = (magnitude <= low) & inside
    in_band = (magnitude > low) & (magnitude <= high) & inside
    tl.store(below_ptr + pid, tl.sum(below.to(tl.int32), 0))
    band_count = tl.sum(in_band.to(tl.int32), 0)
    start = tl.atomic_add(band_fill_ptr, band_count)
    slots = start + tl.cumsum(in_band.to(tl.int32), 0) - 1
    tl.store(band_ptr + slots, magnitude, mask=in_band & (slots < band_capacity))


@triton.jit
def _count_kernel(x_ptr, numel, threshold, counts_ptr, blocks, BLOCK: tl.constexpr):
    """Per block: magnitudes above ``threshold`` (row 0) and equal to it (row 1)."""
    pid = tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < numel
    magnitude = tl.abs(tl.load(x_ptr + offsets, mask=inside, other=0).to(tl.float32))
    tl.store(counts_ptr + pid, tl.sum(((magnitude > threshold) & inside).to(tl.int32), 0))
    tl.store(counts_ptr + blocks + pid,
             tl.sum(((magnitude == threshold) & inside).to(tl.int32), 0))


@triton.jit
def _write_kernel(x_ptr, numel, threshold, missing_ptr, kept_before_ptr, ties_before_ptr,
                  first_ptr, values_ptr, BITMASK: tl.constexpr, BLOCK: tl.constexpr):
    """Keep the magnitudes above ``threshold`` and the first ``missing`` equal to it (memory
    order); write the block's bitmask bytes (or indices) and its kept values."""
    pid = tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < numel
    x = tl.load(x_ptr + offsets, mask=inside, other=0)
    magnitude = tl.abs(x.to(tl.float32))
    tie = ((magnitude == threshold) & inside).to(tl.int32)
    tie_rank = tl.load(ties_before_ptr + pid) + tl.cumsum(tie, 0) - 1
    keep = ((magnitude > threshold) & inside) | ((tie == 1) & (tie_rank < tl.load(missing_ptr)))
    keep_int = keep.to(tl.int32)
    slots = tl.load(kept_before_ptr + pid) + tl.cumsum(keep_int, 0) - 1
    tl.store(values_ptr + slots, x, mask=keep)
    if BITMASK:
        bits = tl.reshape(keep_int, (BLOCK // 8, 8)) << tl.arange(0, 8)[None, :]
        byte_offsets = pid * (BLOCK // 8) + tl.arange(0, BLOCK // 8)
        tl.store(first_ptr + byte_offsets, tl.sum(bits, 1).to(tl.uint8),
                 mask=byte_offsets < (numel + 7) // 8)
    else:
        tl.store(first_ptr + slots, offsets.to(first_ptr.dtype.element_ty), mask=keep)


@triton.jit
def _popcount_kernel(bits_ptr, nbytes, counts_ptr, BLOCK: tl.constexpr):
    """Per block of ``BLOCK`` elements: how many bits of its ``BLOCK // 8`` bytes are set."""
    pid = tl.program_id(0)
    byte_offsets = pid * (BLOCK // 8) + tl.arange(0, BLOCK // 8)
    byte = tl.load(bits_ptr + byte_offsets, mask=byte_offsets < nbytes, other=0).to(tl.int32)
    bits = (byte[:, None] >> tl.arange(0, 8)[None, :]) & 1
    tl.store(counts_ptr + pid, tl.sum(tl.sum(bits, 1), 0))


@triton.jit
def _scatter_kernel(bits_ptr, values_ptr, kept_before_ptr, out_ptr, numel,
                    BLOCK: tl.constexpr):
    """Write the block's dense elements: its next kept value where a bit is set, else zero."""
    pid = tl.program_id(0)
    byte_offsets = pid * (BLOCK // 8) + tl.arange(0, BLOCK // 8)
    byte = tl.load(bits_ptr + byte_offsets, mask=byte_offsets < (numel + 7) // 8,
                   other=0).to(tl.int32)
    keep_int = tl.reshape((byte[:, None] >> tl.arange(0, 8)[None, :]) & 1, (BLOCK,))
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    slots = tl.load(kept_before_ptr + pid) + tl.cumsum(keep_int, 0) - 1
    inside = offsets < numel
    values = tl.load(values_ptr + slots, mask=(keep_int == 1) & inside, other=0)
    tl.store(out_ptr + offsets, values, mask=inside)


def _blocks(numel: int) -> int:
    return triton.cdiv(max(numel, 1), BLOCK)


def _exclusive_prefix(counts: torch.Tensor) -> torch.Tensor:
    return counts.cumsum(0) - counts


def _sampled_magnitudes(flat: torch.Tensor) -> torch.Tensor:
    places = torch.arange(SAMPLE, device=flat.device, dtype=torch.int64) * _HASH % flat.numel()
    return flat.take(places).abs().float()


def _kth_magnitude(flat: torch.Tensor, rank: int) -> float:
    return float(flat.abs().kthvalue(rank).values)


def _threshold(flat: torch.Tensor, rank: int) -> float:
    """The ``rank``-th smallest magnitude of ``flat`` (1-based), exactly."""
    numel = flat.numel()
    if numel <= 8 * SAMPLE:
        return _kth_magnitude(flat, rank)
    quantile = rank / numel
    margin = 5 * math.sqrt(quantile * (1 - quantile) / SAMPLE) + 2 / SAMPLE
    low_rank, high_rank = int((quantile - margin) * SAMPLE), math.ceil(
        (quantile + margin) * SAMPLE)
    if low_rank < 1 or high_rank > SAMPLE:
        return _kth_magnitude(flat, rank)
    sample = _sampled_magnitudes(flat)
    low, high = float(sample.kthvalue(low_rank).values), float(sample.kthvalue(high_rank).values)
    capacity = min(numel, int(4 * margin * numel) + 4 * BLOCK)
    band = flat.new_empty(capacity, dtype=torch.float32)
    below = flat.new_empty(_blocks(numel), dtype=torch.int32)
    fill = flat.new_zeros(1, dtype=torch.int32)
    _band_kernel[(_blocks(numel),)](flat, numel, low, high, below, band, fill, capacity,
                                    BLOCK=BLOCK)
    below_count, band_count = int(below.sum()), int(fill)
    if band_count > capacity or not below_count < rank <= below_count + band_count:
        return _kth_magnitude(flat, rank)  # the sample missed
    return float(band[:band_count].kthvalue(rank - below_count).values)


def _write(flat: torch.Tensor, threshold: float, missing: torch.Tensor, kept: int,
           above: torch.Tensor, ties: torch.Tensor,
           bitmask: bool) -> tuple[torch.Tensor, torch.Tensor]:
    numel = flat.numel()
    ties_before = _exclusive_prefix(ties)
    taken_ties = (missing - ties_before).clamp(min=0).minimum(ties)
    kept_before = _exclusive_prefix(above + taken_ties)
    first = (flat.new_empty((numel + 7) // 8, dtype=torch.uint8) if bitmask
             else flat.new_empty(kept, dtype=torch.int32))
    values = flat.new_empty(kept)
    _write_kernel[(_blocks(numel),)](flat, numel, threshold, missing, kept_before, ties_before,
                                     first, values, BITMASK=bitmask, BLOCK=BLOCK)
    return first, values


def _counts(flat: torch.Tensor, threshold: float) -> torch.Tensor:
    blocks = _blocks(flat.numel())
    counts = flat.new_empty((2, blocks), dtype=torch.int32)
    _count_kernel[(blocks,)](flat, flat.numel(), threshold, counts, blocks, BLOCK=BLOCK)
    return counts.long()


def keep_topk(flat: torch.Tensor, kept: int, bitmask: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``kept`` largest-magnitude elements of the contiguous 1-d ``flat``, encoded as
    ``(bitmask, values)`` or ``(int32 indices, values)``, ties first in memory order."""
    numel = flat.numel()
    if kept == numel:  # everything kept: the threshold is below every magnitude
        threshold = -1.0
    else:
        threshold = _threshold(flat, numel - kept)
    counts = _counts(flat, threshold)
    missing = kept - counts[0].sum(0, keepdim=True)
    return _write(flat, threshold, missing, kept, counts[0], counts[1], bitmask)


def above_counts(flat: torch.Tensor, threshold: float) -> torch.Tensor:
    """Per block, the elements of ``flat`` whose magnitude is above ``threshold``."""
    return _counts(flat, threshold)[0]


def write_above(flat: torch.Tensor, threshold: float, counts: torch.Tensor,
                bitmask: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The elements above ``threshold`` encoded, given their per-block ``counts`` (from
    :func:`above_counts`)."""
    no_ties = torch.zeros_like(counts)
    return _write(flat, threshold, no_ties[:1], int(counts.sum()), counts, no_ties, bitmask)


def scatter_bitmask(bits: torch.Tensor, values: torch.Tensor, numel: int) -> torch.Tensor:
    """The flat dense tensor of ``numel`` elements: ``values`` in order where a bit is set, zero
    elsewhere."""
    blocks = _blocks(numel)
    counts = bits.new_empty(blocks, dtype=torch.int32)
    _popcount_kernel[(blocks,)](bits, bits.numel(), counts, BLOCK=BLOCK)
    out = values.new_empty(numel)
    _scatter_kernel[(blocks,)](bits, values, _exclusive_prefix(counts.long()), out, numel,
                               BLOCK=BLOCK)
    return out
