"""DropIT's fused GPU kernels, written in Triton: the same operators as the CPU extension's
(``keep_topk``, ``keep_random``, ``above_counts``, ``write_above``, ``scatter_bitmask``), giving
bit-identical tensors to the eager path (``keep_random``: to the CPU kernel, given its seed).

The input is cut into blocks of :data:`BLOCK` elements. Every pass runs at most
:data:`PROGRAMS` programs, each walking a contiguous chunk of blocks (:func:`_chunked_grid`):
a histogram pass adds its program's histogram to the shared one once (one atomic per bin a
program), and a count or popcount pass stores one count per program (per chunk), from which
the write or scatter program adds up where its chunk's output starts (a sum over at most
``PROGRAMS`` numbers, in registers) and carries it from block to block: no scan launch. The
radix select's last pass works those starts out itself (:func:`_finish_select`).

- ``keep_topk`` (``mink``): the exact threshold by a radix select on the magnitudes' float32
  bit patterns (non-negative floats order as their bits do): one pass per byte that the input's
  dtype can set, from the highest (four for float32, three for float16, two for bfloat16), each
  a histogram of that byte over the elements whose higher bytes match those chosen so far. Each
  program of a pass works the chosen bytes out again from the earlier histograms (128 counts
  for the top byte, whose highest bit is the sign's, 256 for each later one), so no launch
  goes to picking them. The last pass also counts, per program, the elements above in the
  upper bytes and keeps its histogram of the last byte; the last of its programs to finish
  (a count of finished programs, no waiting) reads from them, for the threshold now known,
  where each chunk's kept elements and ties start. A write pass then writes the bitmask (or
  indices) and the kept values, with the ties that fill the count taken first in memory order,
  as the eager ``mink`` does: no counting pass reads the input again.
- ``keep_random`` (``random``): the same select and write over a random key per element,
  computed in the kernels from a seed drawn on the device (the CPU kernel's keys: the top 30
  bits of the element's number in SplitMix64's stream), four histogram passes that read
  nothing (the keys are 30-bit patterns, as float32's), then the write, which scales the values.
- ``above_counts`` / ``write_above`` (``mink_approx``): the count and write passes with a given
  threshold and no ties kept.
- ``scatter_bitmask`` (backward): per-chunk popcounts of the bitmask, then one pass that writes
  every element of the dense input (kept values or zero).

Launches per call (what a host-bound GPU step pays for, docs/benchmarks.md, GPU section):
``keep_topk`` makes one pass per byte + write: 3 for bfloat16, 4 for float16, 5 for float32 (one
fewer since 2026-11-27, when a count pass ran between them; 3 with every element kept: a fill,
count, write; none of them touches the histograms); ``keep_random`` 6 (the seed's draw, four
passes, the write); ``above_counts`` and ``write_above`` one pass
each (after a fill where the threshold is a number), ``scatter_bitmask`` 2.

The radix select's histograms (at most 128 + 3 x 256 int32) and the last pass's count of
finished programs live in a cached workspace that the write kernel and that pass's last
program leave zero (:mod:`.histogram_workspace`): no zeroing launch, one launch saved per
DropIT layer's forward, paid in host time on a host-bound step (issue 37).

Memory traffic per input element of ``e`` bytes (2 for bfloat16 and float16, 4 for float32),
the prediction for a GPU run to check (a 19.4 M-element bfloat16 input is 38.8 MB a read pass,
about 13 us at 3 TB/s): each histogram pass reads ``e`` bytes; the write reads ``e`` and
writes 1/8 byte of bitmask (or nothing) per element plus ``e`` (``e + 4`` with indices) per
kept element; the popcount reads 1/8 byte and the scatter 1/8 byte plus ``e`` per kept element,
and writes ``e``. Beside those: at most 128 atomics a program in the first histogram pass and
256 in a later one (only non-empty bins: few after the first); the last pass's 2 KB row a
program (3.2 MB for the 19.4 M elements, 1576 programs of 3 blocks), of which its last program
reads 8 bytes a row, and 12 bytes a program that the write reads. ``keep_topk`` on bfloat16 is
so three read passes (2 bytes each) plus its output (four before 2026-11-27, with the count).

A histogram pass costs beyond its read: ``tl.histogram``'s lowering costs about in proportion
to its bins (per element, a ballot per bit of the bin, then a popcount per bin a lane owns),
hence no more bins than a byte can take (128 for the top one), the elements left out counted
into bin 0 and taken off. Instructions a thread runs per block in the ``sm_90`` build (the
loop of each kernel, 4,096 elements of bfloat16 a block, 4 warps; from the SASS, a proxy for
an instruction-bound pass: at ~0.93 T warp instructions a second on 132 SMs, 2,000 of them
over 19.4 M elements take ~40 us, a read at 3 TB/s 13 us): first histogram ~1,450, later one
~2,070 (~2,290 as the last, counting what is above), write ~1,850 with its branch that keeps
ties (~1,100 on blocks without one), popcount ~340, scatter ~710; a plain read of the block
~490; the count pass the last histogram pass replaced ~330. What an H200 measured before these
changes, and the prediction for the next run: docs/dropit.md, *Fused kernels (CPU and
GPU)*.

The threshold and the offsets stay in device memory and every output size follows from the
shape: ``keep_topk`` never waits for the GPU. ``write_above`` needs its kept count on the
host, to size its output. Inputs of 2**31 elements or more, and float64 inputs, stay on the
eager path (:func:`~.library.usable`). ``tests/helpers/compile_triton_kernels.py`` compiles
every launch for ``sm_90`` without a GPU.

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

from ...common.random_source import device_seed
from .codec_kernels import rounded_to
from .grid import ceil_div, next_power_of_2
from .histogram_workspace import forget, zeroed_histograms

BLOCK = 4096
"""Elements per block, the step of every pass (a multiple of 8: a block writes whole bitmask
bytes). With :data:`PROGRAMS`, from a sweep of ``keep_topk`` on an H200 (2026-11-26, 19.4 M
elements, default 4 warps; ms): bfloat16 0.436 at 512 programs of 1024-element blocks, 0.369
at 2112 of 4096; float32 0.776 and 0.617. 8 warps: bfloat16 0.339, float32 0.660, and the
slowest of all with 1024-element blocks."""
PROGRAMS = 2112
"""Most programs of every pass (16 a streaming multiprocessor of a 132-SM H100): each walks a
contiguous chunk of blocks, adds its histogram to the shared one once (the global atomics on
the 256 bins are ``PROGRAMS`` a pass, not one per few blocks) and stores one count a chunk.
The scatter programs, the write programs after a given threshold and the radix select's last
program each add up to ``next_power_of_2(PROGRAMS)`` = 4096 chunk counts in registers (no
spills in the ``sm_90`` build)."""
_TOP_DIGITS = 128
"""Bins of the first histogram: the top byte of a magnitude's bit pattern, whose highest bit (the
sign's) is clear, takes 128 values. A histogram's cost grows with its bins: in the ``sm_90``
build the first pass's loop runs ~1,450 instructions a thread and block with 128 bins, ~1,980
with 256."""
_DIGITS = 256
"""Bins of every later histogram: one byte of the bit pattern."""
_PASSES = {torch.float32: 4, torch.float16: 3, torch.bfloat16: 2}
"""Radix-select passes per input dtype: the bytes of a magnitude's float32 bit pattern that the
dtype can set (a bfloat16 sets the upper two, a float16's 10-bit mantissa ends in bit 13)."""


def _histograms_before(done: int) -> int:
    """Where histogram ``done`` starts in the workspace: after the bins of those before it."""
    return 0 if done == 0 else _TOP_DIGITS + (done - 1) * _DIGITS


_COUNTER_AT = _histograms_before(max(_PASSES.values()))
"""Where the last histogram pass counts its finished programs in the workspace (the last one
to finish sets it back to zero)."""
_WORKSPACE_INTS = _COUNTER_AT + 1
_ROW = 2 * _DIGITS
"""Ints a program of the last histogram pass writes to the scratch: for each value the last
byte may take, the program's elements above the threshold that value would make, then those
equal to it."""


def _scratch_ints(programs: int) -> int:
    """The scratch of a radix select over ``programs`` programs (:func:`_finish_select`): the
    count of ties still to keep, each program's kept elements and ties before it, and each
    program's row (:data:`_ROW`)."""
    return 1 + programs * (2 + _ROW)


@triton.jit
def _histogram_at(done: tl.constexpr):
    """The workspace's indices of histogram ``done`` (:func:`_histograms_before`): 128 bins
    (:data:`_TOP_DIGITS`) for the top byte, then 256 (:data:`_DIGITS`) each."""
    if done == 0:
        return tl.arange(0, 128)
    else:
        return 128 + (done - 1) * 256 + tl.arange(0, 256)


@triton.jit
def _selected_prefix(hist_ptr, rank, PASSES: tl.constexpr, VOLATILE: tl.constexpr = False):
    """The upper ``PASSES`` bytes of the ``rank``-th smallest bit pattern, read from the first
    ``PASSES`` histograms (each program of a later pass works them out again: 128 bins, then
    256 each, one after another in the workspace); ``VOLATILE``: read past every cache, as the
    last program of a pass reads what the others added in it."""
    prefix = 0
    remaining = rank
    for done in tl.static_range(PASSES):
        counts = tl.load(hist_ptr + _histogram_at(done), volatile=VOLATILE)
        below = tl.cumsum(counts, 0) - counts
        chosen = below < remaining
        digit = tl.sum(chosen.to(tl.int32), 0) - 1
        remaining = remaining - tl.max(tl.where(chosen, below, 0), 0)
        prefix = prefix | (digit << (24 - 8 * done))
    return prefix


@triton.jit
def _drawn_keys(seed_ptr, offsets):
    """``random``'s key of each element: the top 30 bits of its number in SplitMix64's stream
    from the seed at ``seed_ptr`` (the CPU kernel's keys), as a float32 bit pattern (below 2.0:
    never NaN or infinite, ordered as the integers)."""
    z = tl.load(seed_ptr).to(tl.uint64, bitcast=True) + \
        (offsets.to(tl.uint64) + 1) * 0x9E3779B97F4A7C15
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9
    z = (z ^ (z >> 27)) * 0x94D049BB133111EB
    z = z ^ (z >> 31)
    return (z >> 34).to(tl.int32).to(tl.float32, bitcast=True)


@triton.jit
def _digit_histogram_kernel(x_ptr, numel, hist_ptr, rank, blocks, chunk, threshold_ptr,
                            scratch_ptr, seed_ptr, PASS: tl.constexpr, BINS: tl.constexpr,
                            LAST: tl.constexpr, DRAWN: tl.constexpr, CHUNKS: tl.constexpr,
                            BLOCK: tl.constexpr):
    """Add the histogram of byte ``3 - PASS`` of the magnitudes' bit patterns in the program's
    ``chunk`` blocks (of ``blocks``), over the elements whose upper bytes equal those the earlier
    passes chose, to histogram ``PASS`` (``BINS`` bins at :func:`_histogram_at`: 128 for the top
    byte, 256 after): one ``tl.histogram`` a block, with the other elements counted into bin 0 and
    taken off it once (the third and fourth passes skip the blocks where nothing matches), then
    one atomic per non-empty bin. The ``LAST`` pass also counts the elements whose upper bytes
    are above those chosen (not NaN, as the write's float comparison sees them) and hands its
    counts on to :func:`_finish_select`: the selection needs no counting pass of its own.
    ``DRAWN``: of ``random``'s keys (:func:`_drawn_keys`) instead, which read nothing."""
    shift: tl.constexpr = 24 - 8 * PASS
    prefix = 0
    if PASS > 0:
        prefix = _selected_prefix(hist_ptr, rank, PASS)
    counts = tl.zeros((BINS,), dtype=tl.int32)
    misses = 0
    above = 0
    first_block = tl.program_id(0) * chunk
    for block in range(first_block, tl.minimum(first_block + chunk, blocks)):
        offsets = block * BLOCK + tl.arange(0, BLOCK)
        inside = offsets < numel
        if DRAWN:
            magnitude = _drawn_keys(seed_ptr, offsets)
        else:
            magnitude = tl.abs(tl.load(x_ptr + offsets, mask=inside, other=0).to(tl.float32))
        key = magnitude.to(tl.int32, bitcast=True)  # >= 0: the sign bit is clear
        match = inside
        if PASS > 0:
            upper = key >> (shift + 8)
            chosen = prefix >> (shift + 8)
            match = match & (upper == chosen)
            if LAST:
                higher = inside & (upper > chosen) & (magnitude == magnitude)
                above += tl.sum(higher.to(tl.int32), 0)
        # no extra bin for the rest (a histogram's cost grows with its bins): the elements
        # that do not match (or lie past the end) go to bin 0 and come off it below
        digits = tl.where(match, (key >> shift) & (BINS - 1), 0)
        if PASS < 2:  # the first two passes match most of a block
            counts += tl.histogram(digits, BINS)
            misses += tl.sum((~match).to(tl.int32), 0)
        else:
            hits = tl.sum(match.to(tl.int32), 0)
            if hits > 0:  # later passes match few: most blocks of a float32 input have none
                counts += tl.histogram(digits, BINS)
                misses += BLOCK - hits
    counts -= tl.where(tl.arange(0, BINS) == 0, misses, 0)
    tl.atomic_add(hist_ptr + _histogram_at(PASS), counts,
                  mask=counts > 0)  # few bins after the first pass
    if LAST:
        _finish_select(hist_ptr, rank, numel, threshold_ptr, scratch_ptr, counts, above,
                       PASS, CHUNKS)


@triton.jit
def _finish_select(hist_ptr, rank, numel, threshold_ptr, scratch_ptr, counts, above,
                   LAST_PASS: tl.constexpr, CHUNKS: tl.constexpr):
    """The last histogram pass's end, in each program: its row of the scratch (for each value
    ``d`` the last byte may take, its elements above the threshold that ``d`` would make: those
    above in the upper bytes and those matching them with a larger last byte; then those
    matching it all), and a count of finished programs. The last program to finish, seeing
    every histogram complete, works the threshold out (stored at ``threshold_ptr``) and, per
    program, the kept elements and ties before it (from the rows, in memory order) and the ties
    still to keep, for the write kernel (:func:`_scratch_ints` for the layout); it sets the
    counter back to zero for the next call."""
    pid = tl.program_id(0)
    programs = tl.num_programs(0)
    rows = scratch_ptr + 1 + 2 * programs
    bins = tl.arange(0, 256)
    row = rows + pid * 512
    tl.store(row + bins, above + tl.cumsum(counts, 0, reverse=True) - counts)
    tl.store(row + 256 + bins, counts)
    tl.debug_barrier()  # every thread's stores before the count that publishes them
    finished = tl.atomic_add(hist_ptr + _counter_at(), 1, sem='acq_rel', scope='gpu')
    if finished == programs - 1:
        prefix = _selected_prefix(hist_ptr, rank, LAST_PASS + 1, VOLATILE=True)
        tl.store(threshold_ptr, prefix.to(tl.float32, bitcast=True))
        digit = (prefix >> (24 - 8 * LAST_PASS)) & 255
        chunks = tl.arange(0, CHUNKS)
        inside = chunks < programs
        above_chunks = tl.load(rows + chunks * 512 + digit, mask=inside, other=0, volatile=True)
        ties_chunks = tl.load(rows + chunks * 512 + 256 + digit, mask=inside, other=0,
                              volatile=True)
        tl.store(scratch_ptr, numel - rank - tl.sum(above_chunks, 0))
        tl.store(scratch_ptr + 1 + chunks, tl.cumsum(above_chunks, 0) - above_chunks,
                 mask=inside)
        tl.store(scratch_ptr + 1 + programs + chunks, tl.cumsum(ties_chunks, 0) - ties_chunks,
                 mask=inside)
        tl.store(hist_ptr + _counter_at(), 0)


@triton.jit
def _counter_at():
    """Where the last histogram pass counts its finished programs (:data:`_COUNTER_AT`)."""
    return 128 + 3 * 256


@triton.jit
def _count_kernel(x_ptr, numel, threshold_ptr, counts_ptr, blocks, chunk, BLOCK: tl.constexpr):
    """Over the program's ``chunk`` blocks: the magnitudes above the threshold at
    ``threshold_ptr`` (one count a program)."""
    pid = tl.program_id(0)
    threshold = tl.load(threshold_ptr)
    above_here = 0
    first_block = pid * chunk
    for block in range(first_block, tl.minimum(first_block + chunk, blocks)):
        offsets = block * BLOCK + tl.arange(0, BLOCK)
        inside = offsets < numel
        magnitude = tl.abs(tl.load(x_ptr + offsets, mask=inside, other=0).to(tl.float32))
        above_here += tl.sum(((magnitude > threshold) & inside).to(tl.int32), 0)
    tl.store(counts_ptr + pid, above_here)


@triton.jit
def _write_kernel(x_ptr, numel, threshold_ptr, counts_ptr, kept, first_ptr, values_ptr, blocks,
                  chunk, hist_ptr, seed_ptr, scale, TIES: tl.constexpr, BITMASK: tl.constexpr,
                  DRAWN: tl.constexpr, CHUNKS: tl.constexpr, CLEAR: tl.constexpr,
                  BLOCK: tl.constexpr):
    """Keep the magnitudes above the threshold and (with ``TIES``) the first of those equal to
    it, in memory order, that fill ``kept``; write the bitmask bytes (or indices) and the kept
    values of the program's ``chunk`` blocks, and carry where the next goes from block to block.
    Where the chunk's output starts: with ``TIES``, read from the radix select's scratch at
    ``counts_ptr`` (:func:`_finish_select`: the kept elements and ties before the chunk, the
    ties still to keep); without, the sum of the per-chunk counts at ``counts_ptr`` before it
    (at most ``CHUNKS``, added up here: no scan launch). A block without a tie that could fill
    ``kept`` skips the ties' cumulative sum (a third of the kernel's instructions in the
    ``sm_90`` build). Program 0 also zeroes the ``CLEAR`` histograms at ``hist_ptr`` (the radix
    select's, read by nothing after its last pass) for the next call. ``DRAWN``: keep by
    ``random``'s keys (:func:`_drawn_keys`), the values times ``scale`` (rounded as the eager
    product by a number is).

    No slot past ``kept`` is written: the radix select's rows count every element this float
    comparison keeps above the threshold (its bit pattern is larger: higher upper bytes, or
    the same and a larger last byte), and where they count more (NaN patterns beside a
    threshold of 2**127 or more, which no comparison keeps) the chunks after it start later,
    never earlier."""
    pid = tl.program_id(0)
    for cleared in tl.static_range(CLEAR):
        bins = _histogram_at(cleared)
        tl.store(hist_ptr + bins, tl.zeros_like(bins), mask=pid == 0)
    threshold = tl.load(threshold_ptr)
    if TIES:  # the ties that fill ``kept``: the first ``missing`` in memory order
        missing = tl.load(counts_ptr)
        kept_before = tl.load(counts_ptr + 1 + pid)
        ties_before = tl.load(counts_ptr + 1 + tl.num_programs(0) + pid)
        kept_before += tl.minimum(ties_before, missing)
    else:
        chunks = tl.arange(0, CHUNKS)
        above = tl.load(counts_ptr + chunks, mask=chunks < pid, other=0)
        kept_before = tl.sum(above, 0)
    first_block = pid * chunk
    for block in range(first_block, tl.minimum(first_block + chunk, blocks)):
        offsets = block * BLOCK + tl.arange(0, BLOCK)
        inside = offsets < numel
        x = tl.load(x_ptr + offsets, mask=inside, other=0)
        if DRAWN:
            magnitude = _drawn_keys(seed_ptr, offsets)
            x = rounded_to(x.to(tl.float32) * scale, x.dtype)
        else:
            magnitude = tl.abs(x.to(tl.float32))
        keep = (magnitude > threshold) & inside
        if TIES:
            tie = ((magnitude == threshold) & inside).to(tl.int32)
            tied = tl.sum(tie, 0)
            if (tied > 0) & (ties_before < missing):
                keep = keep | ((tie == 1) & (ties_before + tl.cumsum(tie, 0) - 1 < missing))
            ties_before += tied
        keep_int = keep.to(tl.int32)
        slots = kept_before + tl.cumsum(keep_int, 0) - 1
        tl.store(values_ptr + slots, x, mask=keep)
        if BITMASK:
            bits = tl.reshape(keep_int, (BLOCK // 8, 8)) << tl.arange(0, 8)[None, :]
            byte_offsets = block * (BLOCK // 8) + tl.arange(0, BLOCK // 8)
            tl.store(first_ptr + byte_offsets, tl.sum(bits, 1).to(tl.uint8),
                     mask=byte_offsets < (numel + 7) // 8)
        else:
            tl.store(first_ptr + slots, offsets.to(first_ptr.dtype.element_ty), mask=keep)
        kept_before += tl.sum(keep_int, 0)


@triton.jit
def _popcount_kernel(bits_ptr, nbytes, counts_ptr, blocks, chunk, BLOCK: tl.constexpr):
    """Per program: how many bits are set in the bytes of its ``chunk`` blocks (of ``blocks``,
    ``BLOCK // 8`` bytes each)."""
    set_here = 0
    first_block = tl.program_id(0) * chunk
    for block in range(first_block, tl.minimum(first_block + chunk, blocks)):
        byte_offsets = block * (BLOCK // 8) + tl.arange(0, BLOCK // 8)
        byte = tl.load(bits_ptr + byte_offsets, mask=byte_offsets < nbytes, other=0).to(tl.int32)
        set_here += tl.sum(tl.sum((byte[:, None] >> tl.arange(0, 8)[None, :]) & 1, 1), 0)
    tl.store(counts_ptr + tl.program_id(0), set_here)


@triton.jit
def _scatter_kernel(bits_ptr, values_ptr, chunk_counts_ptr, out_ptr, numel, blocks, chunk,
                    CHUNKS: tl.constexpr, BLOCK: tl.constexpr):
    """Write the dense elements of the program's ``chunk`` blocks: the next kept value where a
    bit is set, else zero. The chunk's first value follows the set bits of the chunks before
    it (their popcounts, at most ``CHUNKS``, added up here: no scan launch)."""
    pid = tl.program_id(0)
    chunks = tl.arange(0, CHUNKS)
    kept_before = tl.sum(tl.load(chunk_counts_ptr + chunks, mask=chunks < pid, other=0), 0)
    first_block = pid * chunk
    for block in range(first_block, tl.minimum(first_block + chunk, blocks)):
        byte_offsets = block * (BLOCK // 8) + tl.arange(0, BLOCK // 8)
        byte = tl.load(bits_ptr + byte_offsets, mask=byte_offsets < (numel + 7) // 8,
                       other=0).to(tl.int32)
        keep_int = tl.reshape((byte[:, None] >> tl.arange(0, 8)[None, :]) & 1, (BLOCK,))
        offsets = block * BLOCK + tl.arange(0, BLOCK)
        slots = kept_before + tl.cumsum(keep_int, 0) - 1
        inside = offsets < numel
        values = tl.load(values_ptr + slots, mask=(keep_int == 1) & inside, other=0)
        tl.store(out_ptr + offsets, values, mask=inside)
        kept_before += tl.sum(keep_int, 0)


def _blocks(numel: int) -> int:
    return ceil_div(max(numel, 1), BLOCK)


def _chunked_grid(blocks: int) -> tuple[tuple[int], int]:
    """The grid of a radix-select or count pass over ``blocks`` blocks (at most
    :data:`PROGRAMS` programs) and the blocks each program walks (its chunk; the last may be
    shorter, and programs past the end walk none)."""
    chunk = ceil_div(blocks, min(PROGRAMS, blocks))
    return (ceil_div(blocks, chunk),), chunk


def _on_device(threshold: float | torch.Tensor, flat: torch.Tensor) -> torch.Tensor:
    if isinstance(threshold, torch.Tensor):
        return threshold.to(flat.device, torch.float32).reshape(1)
    return flat.new_full((1,), threshold, dtype=torch.float32)  # a fill, not a host copy


def _passes(flat: torch.Tensor, seed: torch.Tensor | None) -> int:
    """Radix-select passes over ``flat``'s magnitudes (:data:`_PASSES`), or over ``random``'s
    keys (``seed`` given: 30 bits, four bytes as float32's)."""
    return _PASSES[torch.float32 if seed is not None else flat.dtype]


def _select(flat: torch.Tensor, rank: int, hist: torch.Tensor,
            seed: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``rank``-th smallest magnitude of ``flat`` (1-based; with ``seed``, of ``random``'s
    keys), exactly, as a one-element float32 tensor on its device (a radix select; nothing is
    read back), and the scratch that says where each chunk's kept elements start
    (:func:`_finish_select`). The histograms go to ``hist`` (zeroed int32, at least
    :data:`_WORKSPACE_INTS`; left filled: :func:`_write` with ``clear`` zeroes them)."""
    numel, blocks = flat.numel(), _blocks(flat.numel())
    passes = _passes(flat, seed)
    grid, chunk = _chunked_grid(blocks)
    threshold = flat.new_empty(1, dtype=torch.float32)
    scratch = flat.new_empty(_scratch_ints(grid[0]), dtype=torch.int32)
    chunks = next_power_of_2(grid[0])
    for done in range(passes):
        _digit_histogram_kernel[grid](flat, numel, hist, rank, blocks, chunk, threshold, scratch,
                                      _seed_or(seed, flat), PASS=done,
                                      BINS=_TOP_DIGITS if done == 0 else _DIGITS,
                                      LAST=done == passes - 1, DRAWN=seed is not None,
                                      CHUNKS=chunks, BLOCK=BLOCK)
    return threshold, scratch


def _seed_or(seed: torch.Tensor | None, flat: torch.Tensor) -> torch.Tensor:
    """The seed's pointer for a launch, or (no seed: not read) ``flat``'s."""
    return flat if seed is None else seed


def _counts(flat: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    """Per chunk of blocks (see :func:`_chunked_grid`), the magnitudes above ``threshold`` (a
    tensor on the device)."""
    blocks = _blocks(flat.numel())
    grid, chunk = _chunked_grid(blocks)
    counts = flat.new_empty(grid[0], dtype=torch.int32)
    _count_kernel[grid](flat, flat.numel(), threshold, counts, blocks, chunk, BLOCK=BLOCK)
    return counts


def _write(flat: torch.Tensor, threshold: torch.Tensor, counts: torch.Tensor, kept: int,
           bitmask: bool, ties: bool, hist: torch.Tensor | None = None, clear: int = 0,
           seed: torch.Tensor | None = None,
           scale: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """Write the kept elements: those above the threshold and, with ``ties``, the first of
    those equal to it that fill ``kept``, given ``counts``: with ``ties`` the scratch of
    :func:`_select`, without the per-chunk counts of :func:`_counts`; and zero the first
    ``clear`` histograms of ``hist``. With ``seed``: by ``random``'s keys, the values times
    ``scale``."""
    numel, blocks = flat.numel(), _blocks(flat.numel())
    grid, chunk = _chunked_grid(blocks)
    first = (flat.new_empty((numel + 7) // 8, dtype=torch.uint8) if bitmask
             else flat.new_empty(kept, dtype=torch.int32))
    values = flat.new_empty(kept)
    _write_kernel[grid](flat, numel, threshold, counts, kept, first, values, blocks, chunk,
                        counts if hist is None else hist, _seed_or(seed, flat), scale,
                        TIES=ties, BITMASK=bitmask, DRAWN=seed is not None,
                        CHUNKS=next_power_of_2(grid[0]), CLEAR=clear, BLOCK=BLOCK)
    return first, values


def keep_topk(flat: torch.Tensor, kept: int, bitmask: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The ``kept`` largest-magnitude elements of the contiguous 1-d ``flat``, encoded as
    ``(bitmask, values)`` or ``(int32 indices, values)``, ties first in memory order. The radix
    select's histograms go to the cached workspace (:mod:`.histogram_workspace`), which the
    write kernel leaves zero."""
    return _keep_largest(flat, kept, bitmask, None, 1.0)


def keep_random(flat: torch.Tensor, kept: int, bitmask: bool, scale: float,
                generator: torch.Generator | None) -> tuple[torch.Tensor, torch.Tensor]:
    """``random``'s ``kept`` elements of the contiguous 1-d ``flat``, drawn uniformly without
    replacement: those of the largest keys (:func:`_drawn_keys`) from a seed drawn on the
    device from ``generator`` (the default one without it, or while a CUDA graph is captured:
    :func:`~mmdropit.common.random_source.capturable`; nothing is read back), encoded as
    :func:`keep_topk` encodes, the values times ``scale``. The CPU kernel's operator, with its
    arguments."""
    return _keep_largest(flat, kept, bitmask, device_seed(flat.device, generator), scale)


def _keep_largest(flat: torch.Tensor, kept: int, bitmask: bool, seed: torch.Tensor | None,
                  scale: float) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`keep_topk` (no ``seed``) or :func:`keep_random`."""
    numel = flat.numel()
    if kept == numel:  # everything kept (an empty input too): no histograms, nothing to clear
        threshold = _on_device(-1.0, flat)
        return _write(flat, threshold, _counts(flat, threshold), kept, bitmask, ties=False,
                      seed=seed, scale=scale)
    hist = zeroed_histograms(flat.device, _WORKSPACE_INTS)
    try:
        threshold, scratch = _select(flat, numel - kept, hist, seed)
        return _write(flat, threshold, scratch, kept, bitmask, ties=True, hist=hist,
                      clear=_passes(flat, seed), seed=seed, scale=scale)
    except BaseException:  # histograms perhaps left filled: the next call takes new zeros
        forget(hist)
        raise


def above_counts(flat: torch.Tensor, threshold: float | torch.Tensor) -> torch.Tensor:
    """Per chunk of blocks, the elements of ``flat`` whose magnitude is above ``threshold`` (a
    number, or a one-element tensor on ``flat``'s device, read there); their sum is the kept
    count."""
    return _counts(flat, _on_device(threshold, flat))


def write_above(flat: torch.Tensor, threshold: float | torch.Tensor, counts: torch.Tensor,
                bitmask: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """The elements above ``threshold`` encoded, given their per-chunk ``counts`` (from
    :func:`above_counts`)."""
    return _write(flat, _on_device(threshold, flat), counts, int(counts.sum()), bitmask,
                  ties=False)


def scatter_bitmask(bits: torch.Tensor, values: torch.Tensor, numel: int) -> torch.Tensor:
    """The flat dense tensor of ``numel`` elements: ``values`` in order where a bit is set, zero
    elsewhere."""
    blocks = _blocks(numel)
    grid, chunk = _chunked_grid(blocks)
    chunk_counts = bits.new_empty(grid[0], dtype=torch.int32)
    _popcount_kernel[grid](bits, bits.numel(), chunk_counts, blocks, chunk, BLOCK=BLOCK)
    out = values.new_empty(numel)
    _scatter_kernel[grid](bits, values, chunk_counts, out, numel, blocks, chunk,
                          CHUNKS=next_power_of_2(grid[0]), BLOCK=BLOCK)
    return out
