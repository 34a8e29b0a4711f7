"""DropIT layers inside checkpoint plans under torch.compile: graphs and breaks of the forward
(``torch._dynamo.explain``, each on a thread that ran no checkpoint before).

python docs/results/2026-11-28/compiled_dropit_checkpoints_probe.py
"""
import threading

import timm
import torch
import torch._dynamo

from mmdropit.checkpoint import CheckpointPlan, ModuleTarget, RunTarget, SiblingsTarget
from mmdropit.dropit import to_dropit

PLANS = {
    'blocks': [RunTarget('blocks', 0, 1), ModuleTarget('blocks.2')],
    'siblings': [SiblingsTarget('blocks.0.mlp', ('fc1', 'act')), ModuleTarget('blocks.1.attn')],
    'a layer alone': [ModuleTarget('blocks.0.mlp.fc1'), ModuleTarget('blocks.1.attn.qkv')],
    'blocks, a Linear with a forward of its own': [RunTarget('blocks', 0, 1)],
}


class ScaledLinear(torch.nn.Linear):
    """A forward of its own: DropIT routes the layer's call through a mode."""

    def forward(self, x):
        return super().forward(x) * 0.5


def model(plan):
    torch.manual_seed(0)
    vit = timm.create_model('vit_tiny_patch16_224', img_size=28, patch_size=7, in_chans=1,
                            embed_dim=96, depth=4, num_heads=3, num_classes=10)
    if len(plan) == 1:
        vit.blocks[0].mlp.fc1.__class__ = ScaledLinear
    vit = to_dropit(vit, gamma=0.9, exclude=[])
    CheckpointPlan(targets=plan).apply(vit)
    return vit


def probe(name, plan):
    images = torch.randn(8, 1, 28, 28)
    explained = torch._dynamo.explain(lambda m, x: m(x).logsumexp(1).mean())(model(plan), images)
    print(f'{name}: {explained.graph_count} graphs, {explained.graph_break_count} breaks')


for name, plan in PLANS.items():
    thread = threading.Thread(target=probe, args=(name, plan))
    thread.start()
    thread.join()
