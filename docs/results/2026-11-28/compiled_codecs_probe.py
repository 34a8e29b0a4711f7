"""Compressed activations under ``torch.compile`` (inductor): DeiT-Ti at 112 px, batch 32, one
training step (forward + backward) plain and with 8- / 4-bit activations, eager and compiled,
and compiled with int8 codes inside the graphs (``int8_graph_hooks``, GraphInt8Hook's): the
graphs dynamo makes, the whole step's peak (``CompiledStepPeakMeter``) and the median of 5
timed steps after 2 warm ones, and each step's gradients against the eager plain step's.

Run from the repository root:
``PYTHONPATH=. python docs/results/2026-11-28/compiled_codecs_probe.py``.
"""
import contextlib
import copy
import statistics
import time

import timm
import torch

from mmdropit.codecs import compress_activations
from mmdropit.codecs.graph_codes import int8_graph_hooks
from mmdropit.memory import CompiledStepPeakMeter

torch.manual_seed(0)
base = timm.create_model('deit_tiny_patch16_224', img_size=112, num_classes=10)
images = torch.randn(32, 3, 112, 112)


def step(fn, model, graph_codes=False):
    model.zero_grad(set_to_none=True)
    with int8_graph_hooks() if graph_codes else contextlib.nullcontext():
        loss = fn(images).logsumexp(1).mean()
    loss.backward()


def gradients(model):
    return torch.cat([p.grad.flatten() for p in model.parameters()])


exact = None
for bits, compiled, graph_codes in [(bits, compiled, False) for bits in (None, 8, 4)
                                    for compiled in (False, True)] + [(None, True, True)]:
    model = copy.deepcopy(base)
    if bits:
        compress_activations(model, bits=bits)
    graphs = ''
    if compiled:
        torch._dynamo.reset()
        with int8_graph_hooks() if graph_codes else contextlib.nullcontext():
            graphs = f', {torch._dynamo.explain(model)(images).graph_count} graphs'
        torch._dynamo.reset()
    fn = torch.compile(model) if compiled else model
    for _ in range(2):
        step(fn, model, graph_codes)
    seconds = []
    for _ in range(5):
        start = time.perf_counter()
        step(fn, model, graph_codes)
        seconds.append(time.perf_counter() - start)
    model.zero_grad(set_to_none=True)
    with CompiledStepPeakMeter(model) as meter:
        step(fn, model, graph_codes)
    grads = gradients(model)
    if exact is None:
        exact = grads
    error = ((grads - exact).norm() / exact.norm()).item()
    name = 'graph int8' if graph_codes else f'{bits or 32}-bit'
    print(f'{name} {"compiled" if compiled else "eager"}{graphs}: '
          f'peak {meter.result / 2**20:.1f} MiB, step {statistics.median(seconds):.3f} s, '
          f'gradient error {error:.4f}')
