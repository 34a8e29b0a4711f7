"""ProfiledPeakMeter: the profiler's memory events give the step peak MemTracker gives on an
uncompiled step, and they see the buffers inductor's generated code allocates."""
from __future__ import annotations

import torch
from torch import nn

from mmdropit.memory import ProfiledPeakMeter, StepPeakMeter


def _step(model: nn.Module, images: torch.Tensor, optimizer: torch.optim.Optimizer) -> None:
    model(images).square().mean().backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)


def test_on_an_uncompiled_step_the_peak_is_memtrackers_above_the_state_at_its_start():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                          nn.Flatten(), nn.Linear(16 * 16 * 16, 64), nn.GELU(),
                          nn.Linear(64, 10))
    images = torch.randn(8, 3, 16, 16)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    _step(model, images, optimizer)  # the optimizer creates its state
    with StepPeakMeter(model, optimizer, torch.device('cpu'), reset_peak=True) as tracked:
        _step(model, images, optimizer)
    with ProfiledPeakMeter() as profiled:
        _step(model, images, optimizer)
    state = sum(tracked.result.by_category[kind]
                for kind in ('parameter', 'buffer', 'optimizer_state'))
    # within 1 KiB of 1.5 MiB: the allocator reports a few small buffers that no tensor the
    # dispatcher sees owns (128 bytes in this step)
    assert abs(profiled.result.peak_bytes - (tracked.result.peak_bytes - state)) <= 1024
    assert profiled.result.end_bytes == 0  # gradients set to None, nothing new kept


def test_the_meter_sees_what_inductor_generated_code_allocates():
    values = torch.randn(4096)
    fused = torch.compile(lambda x: x.sin() * 2 + 1, backend='inductor')
    fused(values)  # compiles
    with ProfiledPeakMeter() as meter:
        result = fused(values)
    assert meter.result.allocations == 1  # one fused kernel, one output buffer
    assert meter.result.peak_bytes == meter.result.end_bytes == result.nbytes
