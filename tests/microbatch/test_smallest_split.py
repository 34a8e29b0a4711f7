"""The split search where some part sizes cannot train (Mixup on odd parts, BatchNorm on one
sample): the fewest micro-batches whose parts all train and whose largest fits, found by
measuring, checked against every split."""
from __future__ import annotations

import pytest

from mmdropit import ConfigError
from mmdropit.microbatch import micro_batch_sizes, smallest_split


def _measure(trains, calls: list[int]):
    """A linear peak (100 bytes a sample over 1000) for sizes that ``trains``; the others raise
    as a pipeline or a layer would."""
    def measure(size: int) -> int:
        calls.append(size)
        if not trains(size):
            raise ValueError(f'cannot train on {size} samples')
        return 1000 + 100 * size
    return measure


def _fewest_by_hand(batch_size: int, trains, budget_bytes: int) -> int | None:
    for count in range(1, batch_size + 1):
        parts = micro_batch_sizes(batch_size, count)
        if all(trains(size) for size in parts) and 1000 + 100 * parts[0] <= budget_bytes:
            return count
    return None


CONSTRAINTS = {
    'even parts (Mixup)': lambda size: size % 2 == 0,
    'two samples or more (BatchNorm)': lambda size: size >= 2,
    'any part': lambda size: True,
}


@pytest.mark.parametrize('constraint', CONSTRAINTS)
def test_the_split_is_the_fewest_whose_parts_all_train(constraint):
    trains = CONSTRAINTS[constraint]
    for batch_size in range(2, 41, 2):
        for budget_bytes in range(1150, 1000 + 100 * batch_size, 50):
            calls: list[int] = []
            expected = _fewest_by_hand(batch_size, trains, budget_bytes)
            if expected is None:
                with pytest.raises(ConfigError, match='memory_budget'):
                    smallest_split(batch_size, _measure(trains, calls), budget_bytes)
                continue
            decision = smallest_split(batch_size, _measure(trains, calls), budget_bytes)
            assert decision.micro_batches == expected, (batch_size, budget_bytes, calls)
            assert len(calls) == len(set(calls))  # each size measured once


def test_where_every_size_trains_no_smaller_part_is_measured():
    calls: list[int] = []
    decision = smallest_split(64, _measure(lambda size: True, calls), 1000 + 100 * 22)
    assert decision.micro_batches == 3 and micro_batch_sizes(64, 3) == [22, 21, 21]
    assert 21 not in calls


def test_parts_that_cannot_train_are_a_one_line_error():
    calls: list[int] = []
    with pytest.raises(ConfigError, match='one or two samples cannot train') as error:
        smallest_split(8, _measure(lambda size: size > 2, calls), 1500)
    assert '\n' not in str(error.value)


def test_the_whole_batch_failing_raises_its_own_error():
    with pytest.raises(ValueError, match='cannot train on 7 samples'):
        smallest_split(7, _measure(lambda size: size % 2 == 0, []), 0.5)
