"""Why a micro-batched compiled step peaks above its eager twin: four Linear(512) + GELU layers,
one backward pass with no gradient held and one with the gradients of a pass before held (a
micro-batch after the first), eager and compiled (inductor), their whole peaks
(``CompiledStepPeakMeter``) in units of the parameters' bytes.

Run from the repository root:
``PYTHONPATH=. python docs/results/2026-11-28/compiled_gradients_probe.py``.
"""
import torch
from torch import nn
from mmdropit.memory import CompiledStepPeakMeter
torch.manual_seed(0)
model = nn.Sequential(*[nn.Sequential(nn.Linear(512, 512), nn.GELU()) for _ in range(4)])
x = torch.randn(8, 512)
grad_bytes = sum(p.numel() * 4 for p in model.parameters())
compiled = torch.compile(model)
for name, fn in (('eager', model), ('compiled', compiled)):
    for held in (False, True):
        model.zero_grad(set_to_none=True)
        if held:
            fn(x).sum().backward()
        fn(x).sum().backward()  # warm
        model.zero_grad(set_to_none=True)
        if held:
            fn(x).sum().backward()
        with CompiledStepPeakMeter(model) as m:
            fn(x).sum().backward()
        print(name, 'held' if held else 'fresh', round(m.result / grad_bytes, 2))
