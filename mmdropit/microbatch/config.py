"""Micro-batching's configuration (:class:`MicroBatchConfig`): checked once.

Micro-batches act on a training step, not on a model: the optim wrappers
(``MicroBatchOptimWrapper``, ``MixedPrecisionOptimWrapper``) split each loaded batch as their
configuration says, and the memory budget sets a configuration of its own when its decision
splits the batch.

Example:
    >>> MicroBatchConfig(micro_batches=4).enabled, MicroBatchConfig().enabled
    (True, False)
    >>> MicroBatchConfig(memory_budget='6GB').to_json()
    {'micro_batches': None, 'memory_budget': 6000000000}
    >>> MicroBatchConfig(micro_batches=0)
    Traceback (most recent call last):
    ...
    mmdropit.errors.ConfigError: micro_batches must be a positive integer, got 0
"""
from __future__ import annotations

from dataclasses import InitVar, asdict, dataclass
from typing import ClassVar

from ..common.budget import Budget, parse_budget
from ..errors import ConfigError
from .split import BUDGET_HELP


@dataclass(frozen=True)
class MicroBatchConfig:
    """Each loaded batch as several micro-batches: a fixed number, or the fewest whose measured
    peak fits a memory budget (:func:`~.split.search_split`, on the first batch).

    Args:
        micro_batches: Split every batch into this many micro-batches (sizes differ by at most
            one sample).
        memory_budget: Instead of ``micro_batches``: a fraction of the undivided step's measured
            peak (``0.5``) or a size (``'6GB'``, ``'512MiB'``, or bytes).
        where: Who gives the values, to start error messages with (not stored).

    Raises:
        ConfigError: Both are given, ``micro_batches`` is not a positive integer, or
            ``memory_budget`` is neither a fraction nor a size.

    Config example::

        optim_wrapper = dict(type='MicroBatchOptimWrapper', micro_batches=4,
                             optimizer=dict(type='AdamW', lr=5e-4))
    """

    name: ClassVar[str] = 'micro_batches'
    lossy: ClassVar[bool] = False

    micro_batches: int | None = None
    memory_budget: Budget = None
    where: InitVar[str] = ''

    def __post_init__(self, where: str) -> None:
        prefix = f'{where} ' if where else ''
        count = self.micro_batches
        if count is not None and self.memory_budget is not None:
            raise ConfigError(f'{prefix}give either micro_batches or memory_budget, not both')
        if count is not None and (isinstance(count, bool) or not isinstance(count, int)
                                  or count < 1):
            raise ConfigError(f'{prefix}micro_batches must be a positive integer, got {count!r}')
        object.__setattr__(self, 'memory_budget', parse_budget(self.memory_budget, BUDGET_HELP))

    @property
    def enabled(self) -> bool:
        """Whether batches are split (a number or a budget is set)."""
        return self.micro_batches is not None or self.memory_budget is not None

    def to_json(self) -> dict:
        return asdict(self)
