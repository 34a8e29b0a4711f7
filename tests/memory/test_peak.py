"""StepPeakMeter: the peak of a step and its breakdown on a model whose memory is known."""
import pytest
import torch
import torch.utils.checkpoint as cp
from torch import nn

from mmdropit.memory import CATEGORIES, StepPeakMeter, measure_saved_activations

MIB = 2**20
WIDTH = 512  # a [512, 512] float32 tensor is exactly 1 MiB
BLOCKS = 2


class Chain(nn.Module):
    """BLOCKS blocks of (Linear, ReLU, Linear, ReLU), optionally checkpointed per block."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList(
            nn.Sequential(nn.Linear(WIDTH, WIDTH, bias=False), nn.ReLU(),
                          nn.Linear(WIDTH, WIDTH, bias=False), nn.ReLU())
            for _ in range(BLOCKS))
        self.checkpointed = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for block in self.blocks:
            x = cp.checkpoint(block, x, use_reentrant=False) if self.checkpointed else block(x)
        return x


@pytest.fixture
def chain():
    torch.manual_seed(0)
    net = Chain()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)

    def step() -> torch.Tensor:
        net(torch.randn(WIDTH, WIDTH)).square().mean().backward()  # the batch is made inside
        optimizer.step()
        optimizer.zero_grad()

    step()  # creates the momentum buffers
    return net, optimizer, step


def test_breakdown_of_a_linear_chain(chain):
    net, optimizer, step = chain
    with StepPeakMeter(net, optimizer) as meter:
        step()
    peak = meter.result
    layers = 2 * BLOCKS
    assert peak.device == 'cpu' and peak.reserved_bytes is None
    assert set(peak.by_category) == set(CATEGORIES)
    assert peak.by_category['parameter'] == layers * MIB
    assert peak.by_category['optimizer_state'] == layers * MIB  # one momentum buffer per weight
    assert peak.by_category['buffer'] == 0
    assert peak.peak_bytes == sum(peak.by_category.values())
    # Alive when backward starts: the batch and the output of every ReLU (each 1 MiB), plus a
    # few scalars (the loss).
    assert layers + 1 <= peak.by_category['activation'] / MIB < layers + 1 + 1e-3
    # The activation peak is the highest activation + temporary count over the step: at least
    # that of the moment of the total peak, and no more than the activations plus the few 1 MiB
    # gradients that flow back at once.
    at_total_peak = peak.by_category['activation'] + peak.by_category['temporary']
    assert at_total_peak <= peak.activation_peak_bytes <= peak.by_category['activation'] + 4 * MIB


def test_several_forwards_in_one_region_are_measured_like_one(chain):
    """Two half-batches (micro-batches) of the same step: the activation peak halves, the
    parameters, gradients and optimizer state stay."""
    net, optimizer, _ = chain
    with StepPeakMeter(net, optimizer) as meter:
        for _ in range(2):
            net(torch.randn(WIDTH // 2, WIDTH)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    peak = meter.result
    layers = 2 * BLOCKS
    assert peak.by_category['parameter'] == peak.by_category['optimizer_state'] == layers * MIB
    assert (layers + 1) / 2 <= peak.activation_peak_bytes / MIB < (layers + 1) / 2 + 2.5


def test_checkpointing_lowers_the_activation_peak_and_it_is_seen_during_recomputation(chain):
    net, optimizer, step = chain
    with StepPeakMeter(net, optimizer) as meter:
        step()
    plain = meter.result.activation_peak_bytes
    net.checkpointed = True
    _, saved = measure_saved_activations(lambda: net(torch.randn(WIDTH, WIDTH)), net)
    with StepPeakMeter(net, optimizer) as meter:
        step()
    checkpointed = meter.result.activation_peak_bytes
    assert saved.total_bytes == BLOCKS * MIB  # the block inputs only
    assert checkpointed < plain
    # One block is recomputed in backward: its two ReLU outputs come back for a while.
    assert checkpointed >= saved.total_bytes + 2 * MIB


def test_frozen_parameters_are_counted_and_need_no_gradient_hook(chain):
    net, _, _ = chain
    net.blocks[0][0].weight.requires_grad_(False)
    optimizer = torch.optim.SGD([p for p in net.parameters() if p.requires_grad], lr=0.01)
    with StepPeakMeter(net, optimizer) as meter:
        net(torch.randn(WIDTH, WIDTH)).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    assert meter.result.by_category['parameter'] == 2 * BLOCKS * MIB


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')
def test_cuda_peak_with_and_without_reset():
    net = nn.Linear(1024, 1024).cuda()
    optimizer = torch.optim.SGD(net.parameters(), lr=0.01, momentum=0.9)
    big = torch.empty(64 * MIB, dtype=torch.uint8, device='cuda')
    del big  # raises the allocator's peak before the meter starts
    with StepPeakMeter(net, optimizer, reset_peak=True) as meter:
        net(torch.randn(256, 1024, device='cuda')).sum().backward()
        optimizer.step()
    peak = meter.result
    assert peak.device.startswith('cuda')
    assert peak.by_category['parameter'] == (1024 * 1024 + 1024) * 4
    assert peak.by_category['optimizer_state'] == (1024 * 1024 + 1024) * 4
    assert peak.activation_peak_bytes is None
    assert peak.by_category['parameter'] < peak.peak_bytes < 64 * MIB
    assert peak.reserved_bytes >= peak.peak_bytes
    big = torch.empty(64 * MIB, dtype=torch.uint8, device='cuda')
    del big
    with StepPeakMeter(net, optimizer, reset_peak=False) as meter:
        net(torch.randn(256, 1024, device='cuda')).sum().backward()
    assert meter.result.peak_bytes >= 64 * MIB  # the peak since the last reset, before start()
