"""The cost model's backward figures, checked against MemTracker on chains where the simple
"twice the output" rule was wrong: layers whose input is larger than their output, a tensor
that several layers read (its gradient is summed across their backward passes), and the
input batch, which the caller holds whatever the plan."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from mmdropit.checkpoint import (CheckpointPlan, ModuleTarget, build_chain, predict,
                                 record_step)
from mmdropit.memory.peak import StepPeakMeter


class _Branches(nn.Module):
    """An Inception-like block: three layers read the same tensor."""

    def __init__(self, width: int) -> None:
        super().__init__()
        self.stem = nn.Linear(width, width)
        self.branches = nn.ModuleList(nn.Linear(width, width) for _ in range(3))
        self.head = nn.Linear(width, 5)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        return self.head(self.branches[0](x) * self.branches[1](x) * self.branches[2](x))


def _mlp() -> nn.Module:  # the last layers' inputs are four times their outputs
    return nn.Sequential(nn.Linear(192, 192), nn.Linear(192, 768), nn.GELU(),
                         nn.Linear(768, 192), nn.Linear(192, 5))


def _cnn() -> nn.Module:  # pooling and a strided convolution shrink what flows back
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.MaxPool2d(4),
                         nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.Flatten(),
                         nn.Linear(32 * 4 * 4, 5))


@pytest.mark.parametrize('build,shape', [(_mlp, (8, 17, 192)), (_cnn, (8, 3, 32, 32)),
                                         (lambda: _Branches(256), (64, 256))])
def test_the_unplanned_peak_is_predicted_to_the_byte(build, shape):
    torch.manual_seed(0)
    net = build()
    batch = torch.randn(shape)

    def step():
        return net(batch * 1.0).square().mean()  # the step's own input: an activation

    for _ in range(2):
        with StepPeakMeter(net) as meter:
            step().backward()
        net.zero_grad(set_to_none=True)
    predicted = predict(build_chain(record_step(net, step), net), []).activation_peak
    assert abs(predicted - meter.result.activation_peak_bytes) <= 64, \
        (predicted, meter.result.activation_peak_bytes)


def test_the_input_batch_is_not_counted():
    torch.manual_seed(0)
    net = _cnn()
    batch = torch.randn(8, 3, 32, 32)
    held = predict(build_chain(record_step(net, lambda: net(batch).sum()), net), [])
    made = predict(build_chain(record_step(net, lambda: net(batch * 1.0).sum()), net), [])
    assert made.kept_bytes - held.kept_bytes == batch.nbytes


def test_a_block_left_whole_holds_one_modules_parameter_gradients_at_a_time():
    """A stage of six linear layers recorded as one item (granularity 1): autograd hands each
    layer's 1 MiB weight gradient to ``.grad`` right after its backward, so the six never
    coexist as temporaries (counting them all over-predicted by 5 MiB). The stage is one
    ``nn.Sequential`` of mixed layers: a sequence of blocks is split into its blocks whatever
    the granularity."""
    torch.manual_seed(0)
    stage = nn.Sequential(*[layer for _ in range(3)
                            for layer in (nn.Linear(512, 512), nn.ReLU(), nn.Linear(512, 512))])
    net = nn.Sequential(nn.Linear(512, 512), stage, nn.Linear(512, 5))
    batch = torch.randn(4, 512)

    def step():
        return net(batch * 1.0).square().mean()

    for _ in range(2):
        with StepPeakMeter(net) as meter:
            step().backward()
        net.zero_grad(set_to_none=True)
    chain = build_chain(record_step(net, step), net, granularity=1)
    assert len(chain.items) == 4  # the first layer, the whole stage, the head, the loss
    predicted = predict(chain, []).activation_peak
    assert abs(predicted - meter.result.activation_peak_bytes) <= 64, \
        (predicted, meter.result.activation_peak_bytes)


def test_an_in_place_activation_makes_a_new_gradient_in_a_recomputed_stem():
    """ResNet's stem (convolution, batch norm, ``ReLU(inplace=True)``, max pooling) checkpointed:
    when its recomputation is the step's peak, the in-place ReLU's backward still makes a new
    gradient as large as its input (leaving it out under-predicted ResNet-18's least-memory
    plans by up to a quarter)."""
    torch.manual_seed(0)
    stem = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(inplace=True),
                         nn.MaxPool2d(2))
    net = nn.Sequential(stem, nn.Conv2d(16, 4, 3, stride=2, padding=1), nn.Flatten(),
                        nn.Linear(4 * 8 * 8, 5))
    batch = torch.randn(8, 3, 32, 32)
    plan = CheckpointPlan([ModuleTarget('0')])

    def step():
        return net(batch).square().mean()

    chain = build_chain(record_step(net, step), net)
    segments = [s for s in chain.segments if s.plan_target == plan.targets[0]]
    predicted = predict(chain, segments).activation_peak
    plan.apply(net)
    for _ in range(2):
        with StepPeakMeter(net) as meter:
            step().backward()
        net.zero_grad(set_to_none=True)
    assert abs(predicted - meter.result.activation_peak_bytes) <= 64, \
        (predicted, meter.result.activation_peak_bytes)
