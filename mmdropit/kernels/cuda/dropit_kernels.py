"""DropIT's fused GPU kernels, written in Triton: the same operators as the CPU extension's
(``keep_topk``, ``above_counts``, ``write_above``, ``scatter_bitmask``), giving bit-identical
tensors to the eager path.

The input is cut into blocks of :data:`BLOCK` elements, one Triton program each (:data:`ITEMS`
blocks a program in the radix select and the count).

- ``keep_topk`` (``mink``): the exact threshold by a radix select on the magnitudes' float32
  bit patterns (non-negative floats order as their bits do): one pass per byte that the input's
  dtype can set, from the highest (four for float32, three for float16, two for bfloat16), each
  a histogram of that byte over the elements whose higher bytes match those chosen so far. Each
  program of a pass works the chosen bytes out again from the earlier histograms (256 counts a
  pass, for the ``ITEMS`` blocks it reads), so no launch goes to picking them. A count pass then
  finds, per block, the elements above the threshold and those equal to it; a one-program scan
  places each block's output; a write pass writes the bitmask (or indices) and the kept values,
  with the ties that fill the count taken first in memory order, as the eager ``mink`` does.
- ``above_counts`` / ``write_above`` (``mink_approx``): the count, scan and write passes with a
  given threshold and no ties kept.
- ``scatter_bitmask`` (backward): per-block popcounts of the bitmask, the scan, then one pass
  that writes every element of the dense input (kept values or zero).

Launches are what a host-bound GPU step pays for (docs/benchmarks.md, GPU section):
``keep_topk`` makes 6-8 (one zeroing, the passes, count, scan, write), ``scatter_bitmask`` 3.
The threshold and the offsets stay in device memory and every output size follows from the
shape: ``keep_topk`` never waits for the GPU. ``write_above`` needs its kept count on the host, to size its
output. Inputs of 2**31 elements or more, and float64 inputs, stay on the eager path
(:func:`~.library.usable`). ``tests/helpers/compile_triton_kernels.py`` compiles every launch
for ``sm_90`` without a GPU.

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
ITEMS = 8
"""Blocks per program of the radix select's passes: every program works out the bytes the
earlier passes chose (256 counts a pass) once for its ``ITEMS`` blocks."""
SCAN_BLOCK = 4096
"""Per-block counts the one-program scan adds up per step (with :data:`SCAN_WARPS` warps: a
DeiT-S MLP input of 19 M elements is 19 k blocks, five steps)."""
SCAN_WARPS = 8
_DIGITS = 256  # values of one byte of the bit pattern: the radix select's histogram bins
_PASSES = {torch.float32: 4, torch.float16: 3, torch.bfloat16: 2}
"""Radix-select passes per input dtype: the bytes of a magnitude's float32 bit pattern that the
dtype can set (a bfloat16 sets the upper two, a float16's 10-bit mantissa ends in bit 13)."""


@triton.jit
def _selected_prefix(hist_ptr, rank, PASSES: tl.constexpr):
    """The upper ``PASSES`` bytes of the ``rank``-th smallest bit pattern, read from the first
    ``PASSES`` histograms (each program of a later pass works them out again: 256 bins each)."""
    prefix = 0
    remaining = rank
    for done in tl.static_range(PASSES):
        counts = tl.load(hist_ptr + done * 256 + tl.arange(0, 256))
        below = tl.cumsum(counts, 0) - counts
        chosen = below < remaining
        digit = tl.sum(chosen.to(tl.int32), 0) - 1
        remaining = remaining - tl.max(tl.where(chosen, below, 0), 0)
        prefix = prefix | (digit << (24 - 8 * done))
    return prefix


@triton.jit
def _digit_histogram_kernel(x_ptr, numel, hist_ptr, rank, PASS: tl.constexpr,
                            BLOCK: tl.constexpr, ITEMS: tl.constexpr):
    """Add the histogram of byte ``3 - PASS`` of the magnitudes' bit patterns in the program's
    ``ITEMS`` blocks, over the elements whose upper bytes equal those the earlier passes chose,
    to histogram ``PASS``."""
    shift: tl.constexpr = 24 - 8 * PASS
    prefix = 0
    if PASS > 0:
        prefix = _selected_prefix(hist_ptr, rank, PASS)
    counts = tl.zeros((512,), dtype=tl.int32)
    for item in range(ITEMS):
        offsets = (tl.program_id(0) * ITEMS + item) * BLOCK + tl.arange(0, BLOCK)
        inside = offsets < numel
        magnitude = tl.abs(tl.load(x_ptr + offsets, mask=inside, other=0).to(tl.float32))
        key = magnitude.to(tl.int32, bitcast=True)  # >= 0: the sign bit is clear
        match = inside
        if PASS > 0:
            match = match & ((key >> (shift + 8)) == (prefix >> (shift + 8)))
        digit = tl.where(match, (key >> shift) & 255, 256)  # 256: a bin that is not stored
        counts += tl.histogram(digit, 512)
    bins = tl.arange(0, 512)
    tl.atomic_add(hist_ptr + PASS * 256 + bins, counts,
                  mask=(bins < 256) & (counts > 0))  # few bins after the first pass


@triton.jit
def _count_kernel(x_ptr, numel, hist_ptr, rank, threshold_ptr, counts_ptr, blocks,
                  PASSES: tl.constexpr, BLOCK: tl.constexpr, ITEMS: tl.constexpr):
    """Per block of the program's ``ITEMS``: magnitudes above the threshold (row 0) and equal
    to it (row 1). The threshold is the radix select's (``PASSES`` histograms; program 0
    stores it at ``threshold_ptr``, and every program adds its count above to the slot after
    the histograms), or, with ``PASSES == 0``, the one at ``threshold_ptr``."""
    if PASSES > 0:
        threshold = _selected_prefix(hist_ptr, rank, PASSES).to(tl.float32, bitcast=True)
        tl.store(threshold_ptr, threshold, mask=tl.program_id(0) == 0)
    else:
        threshold = tl.load(threshold_ptr)
    above_here = 0
    for item in range(ITEMS):
        block = tl.program_id(0) * ITEMS + item
        offsets = block * BLOCK + tl.arange(0, BLOCK)
        inside = offsets < numel
        magnitude = tl.abs(tl.load(x_ptr + offsets, mask=inside, other=0).to(tl.float32))
        above = tl.sum(((magnitude > threshold) & inside).to(tl.int32), 0)
        ties = tl.sum(((magnitude == threshold) & inside).to(tl.int32), 0)
        tl.store(counts_ptr + block, above, mask=block < blocks)
        tl.store(counts_ptr + blocks + block, ties, mask=block < blocks)
        above_here += above
    if PASSES > 0:
        tl.atomic_add(hist_ptr + PASSES * 256, above_here)


@triton.jit
def _scan_kernel(counts_ptr, blocks, kept, above_all_ptr, kept_before_ptr, ties_before_ptr,
                 missing_ptr, TIES: tl.constexpr, SCAN_BLOCK: tl.constexpr):
    """One program: the exclusive prefix sums that place each block's output. Without ``TIES``,
    of the counts in row 0. With ``TIES``, the ties to keep (``missing``: ``kept`` less all
    counts above, read at ``above_all_ptr``) are taken first in memory order: ``ties_before``
    is the prefix of row 1 and ``kept_before`` that of row 0 plus the ties each block keeps."""
    missing = 0
    if TIES:
        missing = kept - tl.load(above_all_ptr)
        tl.store(missing_ptr, missing)
    kept_carry = 0
    ties_carry = 0
    for start in range(0, blocks, SCAN_BLOCK):
        offsets = start + tl.arange(0, SCAN_BLOCK)
        inside = offsets < blocks
        kept_here = tl.load(counts_ptr + offsets, mask=inside, other=0)
        if TIES:
            ties = tl.load(counts_ptr + blocks + offsets, mask=inside, other=0)
            ties_before = ties_carry + tl.cumsum(ties, 0) - ties
            tl.store(ties_before_ptr + offsets, ties_before, mask=inside)
            ties_carry += tl.sum(ties, 0)
            kept_here += tl.minimum(tl.maximum(missing - ties_before, 0), ties)
        tl.store(kept_before_ptr + offsets, kept_carry + tl.cumsum(kept_here, 0) - kept_here,
                 mask=inside)
        kept_carry += tl.sum(kept_here, 0)


@triton.jit
def _write_kernel(x_ptr, numel, threshold_ptr, missing_ptr, kept_before_ptr, ties_before_ptr,
                  first_ptr, values_ptr, TIES: tl.constexpr, BITMASK: tl.constexpr,
                  BLOCK: tl.constexpr):
    """Keep the magnitudes above the threshold and (with ``TIES``) the first ``missing`` equal
    to it in memory order; write the block's bitmask bytes (or indices) and its kept values."""
    pid = tl.program_id(0)
    threshold = tl.load(threshold_ptr)
    offsets = pid * BLOCK + tl.arange(0, BLOCK)
    inside = offsets < numel
    x = tl.load(x_ptr + offsets, mask=inside, other=0)
    magnitude = tl.abs(x.to(tl.float32))
    keep = (magnitude > threshold) & inside
    if TIES:
        tie = ((magnitude == threshold) & inside).to(tl.int32)
        tie_rank = tl.load(ties_before_ptr + pid) + tl.cumsum(tie, 0) - 1
        keep = keep | ((tie == 1) & (tie_rank < tl.load(missing_ptr)))
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


def _on_device(threshold: float | torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    if isinstance(threshold, torch.Tensor):
        return threshold.to(flat.device, torch.float32).reshape(1)
    return flat.new_full((1,), threshold, dtype=torch.float32)  # a fill, not a host copy


def _select(flat: torch.Tensor, rank: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """The ``rank``-th smallest magnitude of ``flat`` (1-based), exactly, as a one-element
    float32 tensor on its device (a radix select; nothing is read back), the per-block counts
    above it (row 0) and equal to it (row 1), and the count above it in all (one element)."""
    numel, blocks = flat.numel(), _blocks(flat.numel())
    passes = _PASSES[flat.dtype]
    hist = flat.new_zeros(passes * _DIGITS + 1, dtype=torch.int32)  # then the count above
    grid = (triton.cdiv(blocks, ITEMS),)
    for done in range(passes):
        _digit_histogram_kernel[grid](flat, numel, hist, rank, PASS=done, BLOCK=BLOCK,
                                      ITEMS=ITEMS)
    threshold = flat.new_empty(1, dtype=torch.float32)
    counts = flat.new_empty((2, blocks), dtype=torch.int32)
    _count_kernel[grid](flat, numel, hist, rank, threshold, counts, blocks, PASSES=passes,
                        BLOCK=BLOCK, ITEMS=ITEMS)
    return threshold, counts, hist[-1:]


def _counts(flat: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """Per block, the magnitudes above ``threshold`` (a tensor on the device; row 0) and equal
    to it (row 1)."""
    blocks = _blocks(flat.numel())
    counts = flat.new_empty((2, blocks), dtype=torch.int32)
    _count_kernel[(triton.cdiv(blocks, ITEMS),)](flat, flat.numel(), counts, 0, threshold,
                                                  counts, blocks, PASSES=0, BLOCK=BLOCK,
                                                  ITEMS=ITEMS)
    return counts


def _scan(counts: torch.Tensor, kept: int = 0,
          above_all: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor,
                                                          torch.Tensor]:
    """Where each block's output starts (the kept ones before it), and, given ``above_all``
    (the count above the threshold, on the device), the ties before each block and how many
    ties fill ``kept`` (both left unwritten without it)."""
    blocks = counts.shape[-1]
    places = counts.new_empty(2 * blocks + 1)  # kept before, ties before, missing
    kept_before, ties_before, missing = places[:blocks], places[blocks:-1], places[-1:]
    ties = above_all is not None
    _scan_kernel[(1,)](counts, blocks, kept, above_all if ties else missing, kept_before,
                       ties_before, missing, TIES=ties, SCAN_BLOCK=SCAN_BLOCK,
                       num_warps=SCAN_WARPS)
    return kept_before, ties_before, missing


def _write(flat: torch.Tensor, threshold: torch.Tensor, counts: torch.Tensor, kept: int,
           bitmask: bool, above_all: torch.Tensor | None = None) -> tuple[torch.Tensor,
                                                                         torch.Tensor]:
    """Place every block's output (the scan), then write the kept elements: those above the
    threshold and, given ``above_all`` (their number, on the device), the first of those equal
    to it that fill ``kept``."""
    numel, blocks = flat.numel(), counts.shape[-1]
    kept_before, ties_before, missing = _scan(counts, kept, above_all)
    first = (flat.new_empty((numel + 7) // 8, dtype=torch.uint8) if bitmask
             else flat.new_empty(kept, dtype=torch.int32))
    values = flat.new_empty(kept)
    _write_kernel[(blocks,)](flat, numel, threshold, missing, kept_before, ties_before, first,
                             values, TIES=above_all is not None, BITMASK=bitmask, BLOCK=BLOCK)
    return first, values


def keep_topk(flat: torch.Tensor, kept: int, bitmask: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``kept`` largest-magnitude elements of the contiguous 1-d ``flat``, encoded as
    ``(bitmask, values)`` or ``(int32 indices, values)``, ties first in memory order."""
    numel = flat.numel()
    if kept == numel:  # everything kept: a threshold below every magnitude, no ties to take
        threshold = _on_device(-1.0, flat)
        return _write(flat, threshold, _counts(flat, threshold), kept, bitmask)
    threshold, counts, above_all = _select(flat, numel - kept)
    return _write(flat, threshold, counts, kept, bitmask, above_all)


def above_counts(flat: torch.Tensor, threshold: float | torch.Tensor) -> torch.Tensor:
    """Per block, the elements of ``flat`` whose magnitude is above ``threshold`` (a number, or
    a one-element tensor on ``flat``'s device, read there)."""
    return _counts(flat, _on_device(threshold, flat))[0]


def write_above(flat: torch.Tensor, threshold: float | torch.Tensor, counts: torch.Tensor,
                bitmask: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The elements above ``threshold`` encoded, given their per-block ``counts`` (from
    :func:`above_counts`)."""
    return _write(flat, _on_device(threshold, flat), counts, int(counts.sum()), bitmask)


def scatter_bitmask(bits: torch.Tensor, values: torch.Tensor, numel: int) -> torch.Tensor:
    """The flat dense tensor of ``numel`` elements: ``values`` in order where a bit is set, zero
    elsewhere."""
    blocks = _blocks(numel)
    counts = bits.new_empty(blocks, dtype=torch.int32)
    _popcount_kernel[(blocks,)](bits, bits.numel(), counts, BLOCK=BLOCK)
    out = values.new_empty(numel)
    _scatter_kernel[(blocks,)](bits, values, _scan(counts)[0], out, numel, BLOCK=BLOCK)
    return out
