"""DropIT's fused GPU kernels, written in Triton: the same operators as the CPU extension's
(``keep_topk``, ``above_counts``, ``write_above``, ``scatter_bitmask``), giving bit-identical
tensors to the eager path.

The input is cut into blocks of :data:`BLOCK` elements, one Triton program each.

- ``keep_topk`` (``mink``): the exact threshold by a radix select on the magnitudes' float32
  bit patterns (non-negative floats order as their bits do): four passes, one per byte from
  the highest, each a histogram of that byte over the elements whose higher bytes match the
  prefix found so far, and a one-program kernel that picks the byte holding the wanted rank.
  A count pass then finds, per block, the elements above the threshold and those equal to it;
  a write pass writes the bitmask (or indices) and the kept values, with the ties that fill the
  count taken first in memory order, as the eager ``mink`` does.
- ``above_counts`` / ``write_above`` (``mink_approx``): the count and write passes with a given
  threshold and no ties kept.
- ``scatter_bitmask`` (backward): per-block popcounts of the bitmask, then one pass that writes
  every element of the dense input (kept values or zero).

Offsets between blocks are prefix sums over the per-block counts (``torch.cumsum``). The
threshold, the prefix and the rank stay in device memory and every output size follows from
the shape: ``keep_topk`` never waits for the GPU (the first GPU run, with a sampled bracket
read back four times a layer, spent most of its time waiting: docs/benchmarks.md, GPU section).
``write_above`` needs its kept count on the host, to size its output. Inputs of 2**31 elements
or more, and float64 inputs, stay on the eager path (:func:`~.library.usable`).

Example (on a GPU; with ``TRITON_INTERPRET=1``, as the tests run it, on CPU tensors too):
    >>> device = 'cuda' if torch.cuda.is_available() else 'cpu'
    >>> flat = torch.tensor([0.1, -3.0, 0.5, 2.0, -0.2, 0.05, 1.0, -0.7, 0.3, 4.0], device=device)
    >>> bits, values = keep_topk(flat, 3, True)
    >>> values.tolist(), scatter_bitmask(bits, values, 10).count_nonzero().item()
    ([-3.0, 2.0, 4.0], 3)
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK = 1024
"""Elements per Triton program (a multiple of 8: one program writes whole bitmask bytes)."""
_DIGITS = 256  # values of one byte of the bit pattern: the radix select's histogram bins


@triton.jit
def _digit_histogram_kernel(x_ptr, numel, prefix_ptr, hist_ptr, SHIFT: tl.constexpr,
                            BLOCK: tl.constexpr):
    """Add the block's histogram of byte ``SHIFT // 8`` of the magnitudes' bit patterns, over
    the elements whose bytes above it equal the prefix's, to the 256 bins at ``hist_ptr``."""
    pid = tl.program_id(0)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < numel
    magnitude = tl.abs(tl.load(x_ptr + offsets, mask=inside, other=0).to(tl.float32))
    key = magnitude.to(tl.int32, bitcast=True)  # >= 0: the sign bit is clear
    match = inside
    if SHIFT < 24:
        match = match & ((key >> (SHIFT + 8)) == (tl.load(prefix_ptr) >> (SHIFT + 8)))
    digit = tl.where(match, (key >> SHIFT) & 255, 256)  # 256: a bin that is not stored
    counts = tl.histogram(digit, 512)
    bins = tl.arange(0, 512)
    tl.atomic_add(hist_ptr + bins, counts, mask=(bins < 256) & (counts > 0))  # few after pass 1


@triton.jit
def _pick_digit_kernel(hist_ptr, prefix_ptr, rank_ptr, SHIFT: tl.constexpr):
    """Find the byte whose bin holds the ``rank``-th smallest matching pattern; put it into the
    prefix and make ``rank`` relative to that bin."""
    counts = tl.load(hist_ptr + tl.arange(0, 256))
    below = tl.cumsum(counts, 0) - counts
    rank = tl.load(rank_ptr)
    chosen = below < rank
    digit = tl.sum(chosen.to(tl.int32), 0) - 1
    tl.store(rank_ptr, rank - tl.max(tl.where(chosen, below, 0), 0))
    tl.store(prefix_ptr, tl.load(prefix_ptr) | (digit << SHIFT))


@triton.jit
def _count_kernel(x_ptr, numel, threshold_ptr, counts_ptr, blocks, BLOCK: tl.constexpr):
    """Per block: magnitudes above the threshold (row 0) and equal to it (row 1)."""
    pid = tl.program_id(0)
    threshold = tl.load(threshold_ptr)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < numel
    magnitude = tl.abs(tl.load(x_ptr + offsets, mask=inside, other=0).to(tl.float32))
    tl.store(counts_ptr + pid, tl.sum(((magnitude > threshold) & inside).to(tl.int32), 0))
    tl.store(counts_ptr + blocks + pid,
             tl.sum(((magnitude == threshold) & inside).to(tl.int32), 0))


@triton.jit
def _write_kernel(x_ptr, numel, threshold_ptr, missing_ptr, kept_before_ptr, ties_before_ptr,
                  first_ptr, values_ptr, BITMASK: tl.constexpr, BLOCK: tl.constexpr):
    """Keep the magnitudes above the threshold and the first ``missing`` equal to it (memory
    order); write the block's bitmask bytes (or indices) and its kept values."""
    pid = tl.program_id(0)
    threshold = tl.load(threshold_ptr)
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


def _threshold(flat: torch.Tensor, rank: int) -> torch.Tensor:
    """The ``rank``-th smallest magnitude of ``flat`` (1-based), exactly, as a one-element
    float32 tensor on its device (a radix select; nothing is read back)."""
    blocks = _blocks(flat.numel())
    hist = flat.new_zeros((4, _DIGITS), dtype=torch.int32)
    prefix = flat.new_zeros(1, dtype=torch.int32)
    remaining = torch.full((1,), rank, dtype=torch.int32, device=flat.device)
    for byte, shift in enumerate((24, 16, 8, 0)):
        _digit_histogram_kernel[(blocks,)](flat, flat.numel(), prefix, hist[byte], SHIFT=shift,
                                           BLOCK=BLOCK)
        _pick_digit_kernel[(1,)](hist[byte], prefix, remaining, SHIFT=shift)
    return prefix.view(torch.float32)


def _on_device(threshold: float | torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    return torch.as_tensor(threshold, dtype=torch.float32, device=flat.device).reshape(1)


def _write(flat: torch.Tensor, threshold: torch.Tensor, missing: torch.Tensor, kept: int,
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


def _counts(flat: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    blocks = _blocks(flat.numel())
    counts = flat.new_empty((2, blocks), dtype=torch.int32)
    _count_kernel[(blocks,)](flat, flat.numel(), threshold, counts, blocks, BLOCK=BLOCK)
    return counts.long()


def keep_topk(flat: torch.Tensor, kept: int, bitmask: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``kept`` largest-magnitude elements of the contiguous 1-d ``flat``, encoded as
    ``(bitmask, values)`` or ``(int32 indices, values)``, ties first in memory order."""
    numel = flat.numel()
    if kept == numel:  # everything kept: the threshold is below every magnitude
        threshold = _on_device(-1.0, flat)
    else:
        threshold = _threshold(flat, numel - kept)
    counts = _counts(flat, threshold)
    missing = kept - counts[0].sum(0, keepdim=True)
    return _write(flat, threshold, missing, kept, counts[0], counts[1], bitmask)


def above_counts(flat: torch.Tensor, threshold: float | torch.Tensor) -> torch.Tensor:
    """Per block, the elements of ``flat`` whose magnitude is above ``threshold`` (a number, or
    a one-element tensor on ``flat``'s device, read there)."""
    return _counts(flat, _on_device(threshold, flat))[0]


def write_above(flat: torch.Tensor, threshold: float | torch.Tensor, counts: torch.Tensor,
                bitmask: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The elements above ``threshold`` encoded, given their per-block ``counts`` (from
    :func:`above_counts`)."""
    no_ties = torch.zeros_like(counts)
    return _write(flat, _on_device(threshold, flat), no_ties[:1], int(counts.sum()), counts,
                  no_ties, bitmask)


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
