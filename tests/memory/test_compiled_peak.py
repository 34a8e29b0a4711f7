"""CompiledStepPeakMeter: on an uncompiled step it gives MemTracker's whole-step peak, gradients
held at the start included; on a compiled step it measures the compiled program."""
from __future__ import annotations

import torch
from torch import nn

from mmdropit.memory import CompiledStepPeakMeter, StepPeakMeter


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.Flatten(), nn.Linear(16 * 16 * 16, 64), nn.GELU(),
                         nn.Linear(64, 10))


def test_on_an_uncompiled_step_it_is_memtrackers_peak_with_gradients_held():
    """Gradients left by the step before (an accumulation window) count once, as the state's."""
    model, images = _model(), torch.randn(8, 3, 16, 16)
    optimizer = torch.optim.AdamW(model.parameters())
    model(images).sum().backward()
    optimizer.step()  # the optimizer's state exists; the gradients stay
    with StepPeakMeter(model, optimizer, torch.device('cpu')) as tracked:
        model(images).square().mean().backward()
    with CompiledStepPeakMeter(model, optimizer) as meter:
        model(images).square().mean().backward()
    assert abs(meter.result - tracked.result.peak_bytes) <= 1024  # buffers no tensor owns


def test_a_compiled_step_is_measured_as_compiled():
    """Inductor fuses ``sin() * 2 + 1`` into one kernel with one output buffer; run eagerly (as
    under a dispatch mode, which makes dynamo skip the frame) the first two results are alive
    together."""
    model = nn.Linear(2, 2)
    held = sum(p.numel() * p.element_size() for p in model.parameters())
    values = torch.randn(2 ** 18)
    fused = torch.compile(lambda x: x.sin() * 2 + 1)
    fused(values)  # compiles
    with CompiledStepPeakMeter(model) as meter:
        result = fused(values)
    assert meter.result == held + result.nbytes
    with StepPeakMeter(model, device=torch.device('cpu')) as tracked:
        fused(values)
    assert tracked.result.peak_bytes == held + 2 * result.nbytes
