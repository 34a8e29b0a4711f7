"""What a 4-block tiny ViT keeps with timm's own checkpointing (torch.utils.checkpoint,
non-reentrant) under nothing, int8 compressed activations and DropIT 0.9 (stop 46).

    python docs/results/2026-11-27/timm_checkpoint_probe.py
"""
import timm
import torch

from mmdropit.codecs import compress_activations
from mmdropit.dropit import to_dropit
from mmdropit.memory import StepPeakMeter

for what in ('none', 'int8', 'dropit', 'dropit-approx'):
    for checkpointed in (False, True):
        torch.manual_seed(0)
        model = timm.create_model('vit_tiny_patch16_224', num_classes=10, img_size=64, depth=4)
        if what == 'int8':
            compress_activations(model, bits=8)
        elif what.startswith('dropit'):
            to_dropit(model, gamma=0.9, strategy='mink_approx' if 'approx' in what else 'mink')
        if checkpointed:
            model.set_grad_checkpointing()
        model.train()
        x = torch.randn(32, 3, 64, 64)
        try:
            with StepPeakMeter(model) as meter:
                model(x).sum().backward()
        except Exception as error:  # noqa: BLE001 (the probe reports what failed)
            print(f'{what:14} checkpointed={checkpointed!s:5} {type(error).__name__}')
            continue
        peak, activations = meter.result.peak_bytes, meter.result.by_category['activation']
        print(f'{what:14} checkpointed={checkpointed!s:5} step peak {peak / 2**20:5.1f} MiB, '
              f'activations at the peak {activations / 2**20:5.1f} MiB')
