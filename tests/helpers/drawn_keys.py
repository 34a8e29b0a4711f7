"""``random``'s keys computed apart from the kernels (NumPy), to check the C++ and Triton
kernels against: the top 30 bits of element ``i``'s number in SplitMix64's stream from a seed,
and the seed the C++ kernel draws from a CPU generator."""
from __future__ import annotations

import numpy as np
import torch

_MASK = (1 << 64) - 1


def drawn_keys(seed: int, numel: int) -> torch.Tensor:
    """The keys of ``numel`` elements from ``seed`` (any 64-bit integer), as float32 bit
    patterns (what the kernels order), in a CPU tensor."""
    index = np.arange(1, numel + 1, dtype=np.uint64)
    with np.errstate(over='ignore'):
        z = np.uint64(seed & _MASK) + index * np.uint64(0x9E3779B97F4A7C15)
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        z = z ^ (z >> np.uint64(31))
    return torch.from_numpy((z >> np.uint64(34)).astype(np.int32)).view(torch.float32)


def cpu_generator_seed(manual_seed: int) -> int:
    """The 64-bit number a CPU ``torch.Generator`` seeded with ``manual_seed`` draws first (what
    ``keep_random`` takes as its seed): two outputs of its MT19937, the first the high half, as
    NumPy's legacy ``RandomState`` of that seed gives them."""
    high, low = (int(v) for v in np.random.RandomState(manual_seed).randint(
        0, 2**32, size=2, dtype=np.uint64))
    return (high << 32) | low
