"""Which elements of a saved input DropIT keeps: the selection strategies.

A strategy looks at the flattened input of a layer and returns a boolean *keep* mask and the
factor the kept values are multiplied by. Dropping the smallest-magnitude elements ("min-k") is
the rule of DropIT (Chen et al., "DropIT: Dropping Intermediate Tensors for Memory-Efficient DNN
Training", ICLR 2023): they contribute least to the weight gradient.

- ``mink``: exact. Keeps exactly ``kept_count(numel, gamma)`` elements, those of largest
  magnitude; among elements equal to the threshold (the ``kept``-th largest magnitude), the first
  in memory order. On the CPU, for large tensors, a random sample brackets the threshold and
  ``torch.kthvalue`` runs only on the ~1% of elements inside the bracket (a full selection is
  4-5x slower there); the result is checked and is the same exact threshold. That check reads
  counts back, free on the CPU but a host sync on a GPU, so other devices select with
  ``torch.topk`` on the device instead (the same threshold, hence the same elements; and, like
  the fused kernels, draw no sample). The ties are filled with a cumulative sum on the device,
  without reading their count back.
- ``mink_approx``: the threshold is the ``gamma``-quantile of a random sample of ``|x|``
  (:data:`SAMPLE_SIZE` elements), which needs no full selection pass. The realised keep ratio
  differs from ``1 - gamma`` by well under a point (standard error below 0.2 points), so the
  kept count depends on the data: storing the kept elements needs that count on the host (one
  host sync per layer on a GPU, eager or fused), which no rewrite can avoid.
- ``random``: keeps ``kept_count(numel, gamma)`` elements drawn uniformly without replacement and
  scales them by ``numel / kept``, so the weight gradient is an unbiased estimate of the exact
  one. No host sync. (The fused kernels draw their set otherwise, see :mod:`.ops`.)

``mink`` and ``random`` (:data:`FIXED_COUNT`) keep a number of elements fixed by the shape and
gamma, so what a layer saves has static shapes (``torch.compile`` traces it whole, see
:mod:`.ops`). Inside a plain checkpoint's region ``mink_approx`` selects as ``mink``
(:func:`counted_strategy`): the recomputation must save tensors of the shapes the first pass
saved (``torch.utils.checkpoint`` compares them), and two samples would keep two counts.

Samples and masks are drawn from the plugin's own generator
(:mod:`mmdropit.common.random_source`), never from the global one, so dropout and drop-path
draw the same masks with and without DropIT.

Example:
    >>> x = torch.tensor([0.1, -3.0, 0.5, 2.0, -0.2, 0.05, 1.0, -0.7, 0.3, 4.0])
    >>> keep, scale = select('mink', x, gamma=0.7)
    >>> x[keep].tolist(), scale
    ([-3.0, 2.0, 4.0], 1.0)
"""
from __future__ import annotations

import math
from collections.abc import Callable

import torch

from ..errors import ConfigError
from ..common.random_source import capturable, generator

SAMPLE_SIZE = 1 << 16
"""Elements sampled by ``mink_approx`` to estimate the threshold."""
FIXED_COUNT = ('mink', 'random')
"""Strategies that keep exactly :func:`kept_count` elements."""

Selection = tuple[torch.Tensor, float]


def counted_strategy(strategy: str) -> str:
    """The fixed-count strategy that selects for ``strategy`` where the count kept must follow
    from the shape (inside a plain checkpoint): ``strategy`` itself, ``mink`` for ``mink_approx``.

    Example:
        >>> counted_strategy('random'), counted_strategy('mink_approx')
        ('random', 'mink')
    """
    return strategy if strategy in FIXED_COUNT else 'mink'


def kept_count(numel: int, gamma: float) -> int:
    """Elements a fixed-count strategy keeps of ``numel`` at ``gamma``.

    Example:
        >>> kept_count(1000, 0.9), kept_count(10, 0.0)
        (100, 10)
    """
    return numel - int(round(gamma * numel))


def _sample(flat: torch.Tensor) -> torch.Tensor:
    index = torch.randint(0, flat.numel(), (SAMPLE_SIZE,), device=flat.device,
                          generator=capturable(generator(flat.device)))
    return flat.take(index)


def host_reads_are_free(device: torch.device) -> bool:
    """Whether reading a value back from ``device`` costs no wait (the CPU): only there does the
    exact threshold use the sampled bracket, whose check reads counts, and does ``mink_approx``
    read its kept count back without stalling the step."""
    return device.type == 'cpu'


def _kth_largest(magnitude: torch.Tensor, kept: int) -> torch.Tensor:
    """The ``kept``-th largest element (``kept >= 1``), exactly, as a 0-d tensor; bracketed by
    a sample when large and on the CPU, selected on the device without a host sync elsewhere."""
    if not host_reads_are_free(magnitude.device):
        return magnitude.topk(kept, sorted=False).values.min()
    numel = magnitude.numel()
    rank = numel - kept + 1  # the same element counted from the smallest
    if numel <= 8 * SAMPLE_SIZE:
        return magnitude.kthvalue(rank).values
    quantile = rank / numel
    margin = 5 * math.sqrt(quantile * (1 - quantile) / SAMPLE_SIZE) + 2 / SAMPLE_SIZE
    sample = _sample(magnitude)
    low_rank = int((quantile - margin) * SAMPLE_SIZE)
    high_rank = int(math.ceil((quantile + margin) * SAMPLE_SIZE))
    if low_rank < 1 or high_rank > SAMPLE_SIZE:
        return magnitude.kthvalue(rank).values
    low, high = sample.kthvalue(low_rank).values, sample.kthvalue(high_rank).values
    below = int(torch.count_nonzero(magnitude <= low))
    band = magnitude[(magnitude > low) & (magnitude <= high)]
    if not below < rank <= below + band.numel():  # the sample missed: select over everything
        return magnitude.kthvalue(rank).values
    return band.kthvalue(rank - below).values


def mink(flat: torch.Tensor, gamma: float) -> Selection:
    """Keep exactly the ``kept_count`` largest-magnitude elements of ``flat`` (ties: the first
    in memory order), without a host sync except on the CPU (see the module docstring)."""
    magnitude = flat.abs()
    numel = flat.numel()
    kept = kept_count(numel, gamma)
    if kept in (0, numel):
        return torch.full_like(flat, kept == numel, dtype=torch.bool), 1.0
    threshold = _kth_largest(magnitude, kept)
    above = magnitude > threshold
    ties = magnitude == threshold
    missing = kept - above.sum()  # on the device: filled by the first ties in memory order
    tie_order = ties.cumsum(0, dtype=torch.int32 if numel < 2**31 else torch.int64)
    return torch.where(ties, tie_order <= missing, above), 1.0


def sampled_threshold(flat: torch.Tensor, gamma: float) -> torch.Tensor:
    """``mink_approx``'s threshold: the ``gamma``-quantile of ``|x|`` over a random sample of
    :data:`SAMPLE_SIZE` elements of ``flat``."""
    rank = max(1, int(round(gamma * SAMPLE_SIZE)))
    return _sample(flat).abs().kthvalue(rank).values


def mink_approx(flat: torch.Tensor, gamma: float) -> Selection:
    """Keep the elements above the ``gamma``-quantile of a random sample of ``|flat|``.

    The selection itself reads nothing back, but the count kept depends on the data: whoever
    stores the kept elements must read it (one host sync per layer on a GPU, unavoidable)."""
    if flat.numel() <= SAMPLE_SIZE:
        return mink(flat, gamma)
    return flat.abs() > sampled_threshold(flat, gamma), 1.0


def random_scale(numel: int, kept: int) -> float:
    """The factor ``random`` multiplies its ``kept`` of ``numel`` elements by: the inverse of
    each element's chance to be kept, so the gradient is unbiased."""
    return numel / max(kept, 1)


def random(flat: torch.Tensor, gamma: float) -> Selection:
    """Keep ``kept_count`` elements drawn uniformly without replacement; scale them by
    :func:`random_scale` so the gradient is unbiased."""
    kept = kept_count(flat.numel(), gamma)
    chosen = torch.randperm(flat.numel(), device=flat.device,
                            generator=capturable(generator(flat.device)))[:kept]
    keep = torch.zeros_like(flat, dtype=torch.bool).index_fill_(0, chosen, True)
    return keep, random_scale(flat.numel(), kept)


STRATEGIES: dict[str, Callable[[torch.Tensor, float], Selection]] = {
    'mink': mink,
    'mink_approx': mink_approx,
    'random': random,
}


def check_strategy(name: str) -> str:
    """Return ``name`` if it is a known strategy.

    Raises:
        ConfigError: If it is not, naming the known ones.
    """
    if name not in STRATEGIES:
        raise ConfigError(f'unknown DropIT strategy {name!r}: use one of '
                          f'{", ".join(map(repr, STRATEGIES))}')
    return name


def check_gamma(gamma: object, where: str = 'gamma') -> float:
    """Return ``gamma`` as a float if it lies in ``[0, 1)``.

    Raises:
        ConfigError: If it is not a number in ``[0, 1)``.
    """
    if isinstance(gamma, bool) or not isinstance(gamma, (int, float)) or not 0 <= gamma < 1:
        raise ConfigError(f'{where} must be a number in [0, 1) (the share of each saved input '
                          f'that is dropped, e.g. 0.9); got {gamma!r}')
    return float(gamma)


def select(strategy: str, flat: torch.Tensor, gamma: float) -> Selection:
    """Apply ``strategy`` to the 1-D tensor ``flat``.

    Args:
        strategy: ``'mink'``, ``'mink_approx'`` or ``'random'``.
        flat: The flattened input, any floating dtype.
        gamma: Share of elements to drop, in ``[0, 1)``.

    Returns:
        ``(keep, scale)``: a boolean mask shaped like ``flat`` and the factor for kept values.
    """
    return STRATEGIES[strategy](flat, gamma)
