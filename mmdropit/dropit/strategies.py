"""Which elements of a saved input DropIT keeps: the selection strategies.

A strategy looks at the flattened input of a layer and returns a boolean *keep* mask and the
factor the kept values are multiplied by. Dropping the smallest-magnitude elements ("min-k") is
the rule of DropIT (Chen et al., "DropIT: Dropping Intermediate Tensors for Memory-Efficient DNN
Training", ICLR 2023): they contribute least to the weight gradient.

- ``mink``: exact. Keeps the elements whose magnitude is above the ``gamma``-quantile of ``|x|``
  (found with ``torch.kthvalue``). Elements equal to that threshold, and exact zeros, are dropped,
  so at most ``round((1 - gamma) * numel)`` elements are kept.
- ``mink_approx``: the threshold is the ``gamma``-quantile of a random sample of ``|x|``
  (:data:`SAMPLE_SIZE` elements), which needs no full selection pass. The realised keep ratio
  differs from ``1 - gamma`` by well under a point (standard error below 0.2 points).
- ``random``: keeps each element with probability ``1 - gamma`` and scales the kept values by
  ``1 / (1 - gamma)``, so the weight gradient is an unbiased estimate of the exact one.

Example:
    >>> x = torch.tensor([0.1, -3.0, 0.5, 2.0, -0.2, 0.05, 1.0, -0.7, 0.3, 4.0])
    >>> keep, scale = select('mink', x, gamma=0.7)
    >>> x[keep].tolist(), scale
    ([-3.0, 2.0, 4.0], 1.0)
"""
from __future__ import annotations

from collections.abc import Callable

import torch

from ..errors import ConfigError

SAMPLE_SIZE = 1 << 16
"""Elements sampled by ``mink_approx`` to estimate the threshold."""

Selection = tuple[torch.Tensor, float]


def _threshold_mask(magnitude: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    return magnitude > threshold


def mink(flat: torch.Tensor, gamma: float) -> Selection:
    """Keep the largest-magnitude ``1 - gamma`` share of ``flat`` exactly."""
    magnitude = flat.abs()
    rank = int(round(gamma * flat.numel()))
    if rank == 0:
        return torch.ones_like(flat, dtype=torch.bool), 1.0
    threshold = magnitude.kthvalue(rank).values
    return _threshold_mask(magnitude, threshold), 1.0


def mink_approx(flat: torch.Tensor, gamma: float) -> Selection:
    """Keep the elements above the ``gamma``-quantile of a random sample of ``|flat|``."""
    if flat.numel() <= SAMPLE_SIZE:
        return mink(flat, gamma)
    magnitude = flat.abs()
    index = torch.randint(0, flat.numel(), (SAMPLE_SIZE,), device=flat.device)
    sample = magnitude.take(index)
    rank = max(1, int(round(gamma * SAMPLE_SIZE)))
    threshold = sample.kthvalue(rank).values
    return _threshold_mask(magnitude, threshold), 1.0


def random(flat: torch.Tensor, gamma: float) -> Selection:
    """Keep each element with probability ``1 - gamma``; rescale so the gradient is unbiased."""
    keep = torch.empty_like(flat, dtype=torch.bool).bernoulli_(1.0 - gamma)
    return keep, 1.0 / (1.0 - gamma)


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
