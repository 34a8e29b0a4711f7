"""DropIT under CUDA graphs (the GPU run's ``compiled`` stage measures it there): the Triton
selection and rebuilding replay from a captured graph, and a compiled DropIT step with
``mode='reduce-overhead'`` is not left outside CUDA graphs (its counters are mutated in place
at a static address). GPU only (``pytest -m cuda``)."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from mmdropit.dropit import keep_ratio, to_dropit
from mmdropit.dropit.strategies import kept_count

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')]


def test_the_triton_selection_replays_from_a_captured_graph():
    from mmdropit.kernels.cuda import dropit_kernels as kernels
    static = torch.randn(140_001, device='cuda')
    kept = kept_count(static.numel(), 0.9)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compiled and warmed up outside the capture
        bits, values = kernels.keep_topk(static, kept, True)
        kernels.scatter_bitmask(bits, values, static.numel())
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        bits, values = kernels.keep_topk(static, kept, True)
        dense = kernels.scatter_bitmask(bits, values, static.numel())
    for seed in range(3):  # new data at the same address, replayed
        static.copy_(torch.randn(static.shape, generator=torch.Generator().manual_seed(seed)))
        graph.replay()
        expected = kernels.keep_topk(static, kept, True)
        assert torch.equal(bits, expected[0]) and torch.equal(values, expected[1])
        assert torch.equal(dense, kernels.scatter_bitmask(*expected, static.numel()))


def test_the_random_selection_replays_with_a_new_seed_each_time():
    """``random``'s seed is drawn on the device: replayed from a captured graph (as a compiled
    ``reduce-overhead`` step replays it), each replay must keep another set, or every step
    would drop the same elements. Given DropIT's own generator, which no capture registers
    (torch 2.11 fails the capture of an unregistered one), the draw under a capture is the
    default generator's (``random_source.capturable``)."""
    from mmdropit.common.random_source import generator
    from mmdropit.kernels.cuda import dropit_kernels as kernels
    static = torch.randn(140_001, device='cuda')
    kept, draw = kept_count(static.numel(), 0.9), generator(static.device)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compiled and warmed up outside the capture
        kernels.keep_random(static, kept, True, 10.0, draw)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        bits, _ = kernels.keep_random(static, kept, True, 10.0, draw)
    replays = []
    for _ in range(3):
        graph.replay()
        replays.append(bits.clone())
    assert not torch.equal(replays[0], replays[1]) and not torch.equal(replays[1], replays[2])


def test_stochastic_rounding_replays_with_new_numbers_each_time():
    """The 4-bit codec's seed comes from DropIT's generator too (the default one under a
    capture): each replay rounds the same values to other codes."""
    from mmdropit.codecs.low_bit import quantize_low
    static = torch.randn(140_001, device='cuda')
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # compiled and warmed up outside the capture
        quantize_low(static, 4)
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        packed, _, _ = quantize_low(static, 4)
    replays = []
    for _ in range(3):
        graph.replay()
        replays.append(packed.clone())
    assert not torch.equal(replays[0], replays[1]) and not torch.equal(replays[1], replays[2])


@pytest.mark.parametrize('strategy', ['mink', 'random'])
def test_a_compiled_dropit_step_stays_inside_cuda_graphs(strategy):
    from torch._dynamo.utils import counters
    torch.manual_seed(0)
    torch._dynamo.reset()
    counters.clear()
    model = to_dropit(nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 10)).cuda(),
                      gamma=0.9, strategy=strategy, exclude=[])
    step = torch.compile(lambda x: model(x).square().mean(), mode='reduce-overhead')
    for _ in range(4):
        step(torch.randn(32, 64, device='cuda')).backward()
    assert not counters['inductor']['cudagraph_skips'], dict(counters['inductor'])
    assert keep_ratio(model) == pytest.approx(0.1, abs=0.01)
