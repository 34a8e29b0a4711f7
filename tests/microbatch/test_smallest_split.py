"""The split search where some part sizes cannot train (Mixup on odd parts, BatchNorm on one
sample): the fewest micro-batches whose parts all train and whose largest fits, found by
measuring, checked against every split."""
from __future__ import annotations

import pytest
import torch

from mmdropit import ConfigError
from mmdropit.microbatch import micro_batch_sizes, search_split, smallest_split
from mmdropit.microbatch.split import CANNOT_TRAIN


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


def test_where_more_parts_leave_a_part_that_cannot_train_fewer_are_tried():
    """Five samples, BatchNorm refusing one, the whole batch out of memory: the line predicts
    parts of two (2 + 2 + 1: one cannot train), and 3 + 2 fits."""
    peaks = {2: 120, 3: 130, 4: None, 5: None}

    def measure(size: int) -> int | None:
        if size == 1:
            raise ValueError('Expected more than 1 value per channel when training')
        return peaks[size]

    decision = smallest_split(5, measure, 135)
    assert decision.micro_batches == 2 and decision.peak_bytes == 130


def test_a_size_that_fails_in_one_process_fails_in_all():
    """``agree`` gets :data:`CANNOT_TRAIN` from the process whose trial raised; the largest over
    the processes makes every one treat the size as one that cannot train."""
    model = torch.nn.Linear(2, 2)
    sizes: list[int] = []
    handed: list[int | None] = []

    def run_part(size: int) -> None:  # this process trains every size but 1
        sizes.append(size)
        if size == 1:
            raise ValueError('cannot train on one sample')
        model(torch.ones(size, 2)).sum().backward()

    def agree(peak: int | None) -> int | None:  # another process cannot train 3 samples
        handed.append(peak)
        return CANNOT_TRAIN if sizes[-1] == 3 else peak

    decision = search_split(6, run_part, model, None, 0.8, agree=agree)
    assert handed[sizes.index(1)] == CANNOT_TRAIN  # this process's own failure, handed on
    assert 3 in sizes and not {1, 3} & set(decision.measured)
    assert not {1, 3} & set(micro_batch_sizes(6, decision.micro_batches))
