"""Shape buckets under DDP: processes whose batches fall into different buckets decide on one
together (two gloo processes, each padding its own images as mmdet does)."""
from __future__ import annotations

import json
from pathlib import Path

import torch
import torch.distributed as dist

from mmdropit.engine.hooks.shape_buckets import ShapeBucketHook, agreed_key, shape_key
from mmdropit.engine.optim.micro_batching import max_over_ranks
from tests.conftest import free_port

# the largest image of each rank's batch, per iteration: rank 1's second one is wider
SHAPES = {0: [(800, 1216), (800, 1216), (608, 800)],
          1: [(800, 1216), (768, 1344), (600, 800)]}


class _AgreedPeakHook(ShapeBucketHook):
    """Decides as the memory budget does, by a collective (the largest peak of the ranks)."""

    def __init__(self, rank: int) -> None:
        super().__init__(bucket=128)
        self.rank = rank

    def decide(self, runner, data_batch: dict, key) -> object:
        return max_over_ranks(1000 + self.rank)

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
    Path(f'{out}{rank}.json').write_text(json.dumps(buckets))
    dist.destroy_process_group()


def test_processes_in_different_buckets_decide_on_the_largest_together(tmp_path):
    torch.multiprocessing.spawn(_train, args=(free_port(), str(tmp_path / 'rank')), nprocs=2)
    ranks = [json.loads((tmp_path / f'rank{rank}.json').read_text()) for rank in (0, 1)]
    assert ranks[0] == ranks[1]
    assert [bucket for bucket, _, _ in ranks[0]] == [
        [2, 3, 896, 1280], [2, 3, 896, 1408], [2, 3, 640, 896]]
    assert all(decision == 1001 and gradient == 2.0 for _, decision, gradient in ranks[0])


def test_without_a_process_group_the_key_is_the_batch_own():
    key = shape_key([torch.zeros(3, 600, 800)], bucket=128)
    assert agreed_key(key) == key == (1, 3, 640, 896)
