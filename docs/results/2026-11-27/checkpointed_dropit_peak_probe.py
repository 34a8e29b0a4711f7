"""Where a step's memory peaks under timm's per-block checkpointing, with and without DropIT:
one bf16-autocast step of a timm model (SGD with momentum) under PyTorch's ``MemTracker``, the
activation + temporary bytes after every operator, and the operator, module and pass at the
highest point and at the step's total peak (stop 48).

    python docs/results/2026-11-27/checkpointed_dropit_peak_probe.py deit_small_patch16_224 64
    python docs/results/2026-11-27/checkpointed_dropit_peak_probe.py resnet50 32 --dropit
"""
import argparse

import timm
import torch

from mmdropit.dropit import DropITConfig
from mmdropit.memory import peak

MIB = 2**20
parser = argparse.ArgumentParser()
parser.add_argument('model')
parser.add_argument('batch', type=int)
parser.add_argument('--dropit', action='store_true', help='DropIT 0.9 mink on every layer')
args = parser.parse_args()
trace: list[tuple[int, int, bool, str, str]] = []  # activations, total, backward, module, op


class Tracer(peak._ActivationPeakTracker):
    """The meter's tracker, noting the bytes after every operator."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        result = super().__torch_dispatch__(func, types, args, kwargs)
        counts = self._curr_mem_snap.get(self.device, {})
        activations = sum(n for key, n in counts.items()
                          if getattr(key, 'value', key) in peak._ACTIVATION_KINDS)
        module = max(self._mod_tracker.parents, key=len)
        trace.append((activations, counts.get(peak._TRACKER_TOTAL, 0), self._mod_tracker.is_bw,
                      module, str(func)))
        return result


torch.manual_seed(0)
model = timm.create_model(args.model, num_classes=100)
model.set_grad_checkpointing(True)
if args.dropit:
    DropITConfig(0.9, 'mink').apply(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
x, y = torch.randn(args.batch, 3, 224, 224), torch.randint(0, 100, (args.batch,))


def step() -> None:
    with torch.autocast('cpu', torch.bfloat16):
        loss = torch.nn.functional.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()


step()  # the momentum buffers exist from here on
tracer = Tracer(torch.device('cpu'), [])
tracer.track_external(model, optimizer)
with tracer:
    step()
for name, column in (('activation peak', 0), ('step peak', 1)):
    at = max(range(len(trace)), key=lambda index: trace[index][column])
    activations, total, backward, module, op = trace[at]
    print(f'{name}: {trace[at][column] / MIB:.1f} MiB at operator {at} of {len(trace)} '
          f'({"backward" if backward else "forward"}, {module}, {op}); activations '
          f'{activations / MIB:.1f} MiB, all {total / MIB:.1f} MiB')
