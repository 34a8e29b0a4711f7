# The tiny ViT with DropIT 0.9 and the least-memory checkpoint plan (planned on the first
# iteration with DropIT's compact bytes; the plan is logged and written to the work dir).
# python tools/train.py configs/tiny/vit-tiny_dropit-mink0.9_ckpt-plan_mnist5k.py
_base_ = ['./vit-tiny_dropit-mink0.9_mnist5k.py']

custom_hooks = [
    dict(type='DropITHook', gamma=0.9, strategy='mink'),
    dict(type='CheckpointPlanHook', budget=None),
    dict(type='MemoryReportHook', interval=100),
]
