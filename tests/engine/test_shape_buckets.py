"""Shape buckets: processes whose batches fall into different buckets decide on one together
(two gloo processes, each padding its own images as mmdet does), and a batch larger than the
one its bucket's decision was made on has it made again."""
from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist

from mmdropit.engine.hooks.shape_buckets import (ShapeBucketHook, agreed_key, batch_extent,
                                                 shape_key)
from mmdropit.engine.optim.micro_batching import max_over_ranks
from tests.conftest import free_port

# the largest image of each rank's batch, per iteration: rank 1's second one is wider; rank 0's
# fourth is in the first bucket, and larger than its first batches
SHAPES = {0: [(800, 1216), (800, 1216), (608, 800), (800, 1280), (800, 1216)],
          1: [(800, 1216), (768, 1344), (600, 800), (700, 1200), (790, 1200)]}


class _AgreedPeakHook(ShapeBucketHook):
    """Decides as the memory budget does, by a collective (the largest peak of the ranks)."""

    def __init__(self, rank: int) -> None:
        super().__init__(bucket=128)
        self.rank = rank
        self.made = 0

    def decide(self, runner, data_batch: dict, key) -> object:
        self.made += 1
        return max_over_ranks(1000 + self.rank) + self.made

    def decision_summary(self, runner, key, decision: object) -> str:
        return str(decision)

    def enter(self, runner, decision: object) -> None:
        pass

    def leave(self, runner, decision: object) -> None:
        pass


def _train(rank: int, port: int, out: str) -> None:
    dist.init_process_group('gloo', init_method=f'tcp://127.0.0.1:{port}', rank=rank,
                            world_size=2)
    hook = _AgreedPeakHook(rank)
    buckets = []
    for index, (height, width) in enumerate(SHAPES[rank]):
        batch = dict(inputs=[torch.zeros(3, height, width), torch.zeros(3, 500, 500)])
        hook.before_train_iter(None, index, batch)
        gradient = torch.ones(1)
        dist.all_reduce(gradient)  # DDP's gradient all-reduce after the decision
        buckets.append([list(hook.current), hook.decisions[hook.current], gradient.item()])
    Path(f'{out}{rank}.json').write_text(json.dumps([buckets, hook.extents[(2, 3, 896, 1280)]]))
    dist.destroy_process_group()


def test_processes_in_different_buckets_decide_on_the_largest_together(tmp_path):
    torch.multiprocessing.spawn(_train, args=(free_port(), str(tmp_path / 'rank')), nprocs=2)
    ranks = [json.loads((tmp_path / f'rank{rank}.json').read_text()) for rank in (0, 1)]
    assert ranks[0] == ranks[1]
    buckets, extent = ranks[0]
    assert [bucket for bucket, _, _ in buckets] == [
        [2, 3, 896, 1280], [2, 3, 896, 1408], [2, 3, 640, 896], [2, 3, 896, 1280],
        [2, 3, 896, 1280]]
    # the fourth batch is larger than the first bucket's first: its decision is made again on
    # it, and kept for the smaller fifth
    assert [decision for _, decision, _ in buckets] == [1002, 1003, 1004, 1005, 1005]
    assert extent == 2 * 3 * 800 * 1280
    assert all(gradient == 2.0 for _, _, gradient in buckets)


def test_without_a_process_group_the_key_is_the_batch_own():
    batch = [torch.zeros(3, 600, 800)]
    key = shape_key(batch, bucket=128)
    assert agreed_key(key, batch_extent(batch)) == ((1, 3, 640, 896), 3 * 600 * 800)
