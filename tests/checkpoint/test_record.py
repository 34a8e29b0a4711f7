"""The recorded times are those of the forward pass without the recorder: its hooks and
dispatch mode cost tens of microseconds an op, which on a model of small ops (or any model on a
GPU) would multiply every recorded time."""
from __future__ import annotations

import statistics
import time

import pytest
import torch
from torch import nn

from mmdropit.checkpoint import ModuleTarget, build_chain
from mmdropit.checkpoint.record import record_step


def test_the_recorders_own_time_is_taken_off_a_model_of_small_ops():
    torch.manual_seed(0)
    net = nn.Sequential(*[nn.Sequential(nn.Linear(4, 4), nn.GELU()) for _ in range(100)])
    x = torch.randn(2, 4)

    def forward_seconds() -> float:
        started = time.perf_counter()
        net(x).sum()
        return time.perf_counter() - started

    plain = statistics.median(forward_seconds() for _ in range(15))
    record = record_step(net, lambda: net(x).sum())
    assert record.recording_seconds_per_op > 0
    blocks = [call for call in record.calls if call.parent == 1]
    assert len(blocks) == 100 and all(call.seconds >= 0 for call in blocks)
    # left in, the recorder's time made this 5-10 times the plain forward pass
    assert sum(call.seconds for call in blocks) < 3 * plain
    assert record.calls[1].seconds <= record.calls[0].seconds * 1.01


def test_every_checkpoint_is_charged_its_machinery():
    """A checkpoint of a tiny module costs more than the module: the hooks, the RNG state and
    the recomputation's set-up (about 0.16 ms a step on this project's CPU)."""
    torch.manual_seed(0)
    net = nn.Sequential(*[nn.Sequential(nn.Linear(4, 4), nn.GELU()) for _ in range(8)])
    x = torch.randn(2, 4)
    record = record_step(net, lambda: net(x).sum())
    chain = build_chain(record, net)
    assert record.checkpoint_seconds > 0
    calls = {call.name: call for call in record.calls}
    modules = [s for s in chain.segments if isinstance(s.target, ModuleTarget) and not s.selective]
    assert len(modules) >= 8
    for segment in modules:
        assert segment.seconds == pytest.approx(
            calls[segment.target.name].seconds + record.checkpoint_seconds)
