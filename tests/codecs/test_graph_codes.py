"""int8 codes inside compiled graphs: the codec is traced into the graph (no graph break, no
Python call per saved tensor once compiled), the compiled step's peak falls, the gradients stay
within the int8 bound; outside compiled graphs parameters and strided views stay as they are."""
from __future__ import annotations

import pytest
import timm
import torch
from torch._subclasses.fake_tensor import is_fake

import mmdropit.codecs.graph_codes as graph_codes
from mmdropit.codecs.graph_codes import int8_graph_hooks
from mmdropit.memory import CompiledStepPeakMeter


def _vit() -> torch.nn.Module:
    torch.manual_seed(0)
    return timm.create_model('vit_tiny_patch16_224', img_size=28, patch_size=7, in_chans=1,
                             embed_dim=96, depth=2, num_heads=3, num_classes=10)


def _step(model: torch.nn.Module, forward, images: torch.Tensor, codes: bool) -> None:
    model.zero_grad(set_to_none=True)
    with int8_graph_hooks() if codes else torch.autograd.graph.saved_tensors_hooks(
            lambda tensor: tensor, lambda tensor: tensor):
        loss = forward(images).logsumexp(1).mean()
    loss.backward()


@pytest.fixture
def quantized(monkeypatch) -> list[tuple[bool, int]]:
    """Each tensor the codec encoded: whether it was traced (a fake tensor), and its size."""
    seen: list[tuple[bool, int]] = []
    original = graph_codes.quantize

    def spy(values: torch.Tensor):
        seen.append((is_fake(values), values.numel()))
        return original(values)

    monkeypatch.setattr(graph_codes, 'quantize', spy)
    return seen


def test_compiled_the_codec_is_in_the_graph_and_the_peak_falls(quantized):
    images = torch.randn(32, 1, 28, 28)
    exact_model = _vit()
    exact_model(images).logsumexp(1).mean().backward()
    exact = [p.grad for p in exact_model.parameters()]
    peaks = {}
    for codes in (False, True):
        torch._dynamo.reset()  # each setting compiles from nothing
        model = _vit()
        compiled = torch.compile(model)
        for _ in range(2):
            _step(model, compiled, images, codes)
        assert all(traced for traced, _ in quantized)  # while compiling, on fake tensors
        assert bool(quantized) == codes
        quantized.clear()
        with CompiledStepPeakMeter(model) as meter:
            _step(model, compiled, images, codes)
        peaks[codes] = meter.result
        assert quantized == []  # nothing left to Python once compiled
    for e, a in zip(exact, (p.grad for p in model.parameters())):
        assert (a - e).norm() <= 0.02 * e.norm() + 1e-7
    assert peaks[True] < 0.75 * peaks[False], peaks
    torch._dynamo.reset()
    with int8_graph_hooks():
        explained = torch._dynamo.explain(_vit())(images)
    assert explained.graph_break_count == 0


def test_eager_parameters_and_strided_views_stay_as_they_are(quantized):
    """Outside compiled graphs the hooks run per tensor: the first Linear's input, a transposed
    view, and both weights (views of parameters) are kept; the GELU's input and the second
    Linear's input, contiguous and of 64 x 256 elements, are stored as codes."""
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(128, 256), torch.nn.GELU(),
                                torch.nn.Linear(256, 8))
    inputs = torch.randn(128, 64).t()
    exact = torch.autograd.grad(model(inputs).square().sum(), list(model.parameters()))
    with int8_graph_hooks():
        loss = model(inputs).square().sum()
    approx = torch.autograd.grad(loss, list(model.parameters()))
    assert quantized == [(False, 64 * 256), (False, 64 * 256)]
    for e, a in zip(exact, approx):
        assert (a - e).norm() <= 0.02 * e.norm()
