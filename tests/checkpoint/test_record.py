"""The recorded times are those of the forward pass without the recorder: its hooks and
dispatch mode cost tens of microseconds an op, which on a model of small ops (or any model on a
GPU) would multiply every recorded time."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from mmdropit.checkpoint import ModuleTarget, build_chain
from mmdropit.checkpoint.record import _Recorder, record_step


def test_the_recorders_own_time_is_taken_off_a_model_of_small_ops(monkeypatch):
    """On a clock that this test moves (so the machine's load cannot change the result), each
    layer takes 1 s and the recorder 3 s an ATen op: the recorder's time is taken off every
    call, per op, and the step's time is that of the unrecorded pass."""
    torch.manual_seed(0)
    net = nn.Sequential(*[nn.Sequential(nn.Linear(4, 4), nn.GELU()) for _ in range(100)])
    x = torch.randn(2, 4)
    clock = [0.0]

    def layer_takes_a_second(*_) -> None:
        clock[0] += 1.0

    for block in net:
        for layer in block:
            layer.register_forward_hook(layer_takes_a_second)  # inside the layer's recorded call
    allocated = _Recorder.allocated

    def slow_allocated(self, output, read):  # called for every ATen op the recorder watches
        clock[0] += 3.0
        return allocated(self, output, read)

    monkeypatch.setattr(_Recorder, 'now', lambda self: clock[0])
    monkeypatch.setattr(_Recorder, 'allocated', slow_allocated)
    record = record_step(net, lambda: net(x).sum())
    assert record.recording_seconds_per_op == pytest.approx(3.0)
    assert record.calls[0].seconds == pytest.approx(200.0)  # the unrecorded pass
    blocks = [call for call in record.calls if call.parent == 1]
    assert len(blocks) == 100
    assert [call.seconds for call in blocks] == pytest.approx([2.0] * 100)
    assert record.calls[1].seconds == pytest.approx(200.0)


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
