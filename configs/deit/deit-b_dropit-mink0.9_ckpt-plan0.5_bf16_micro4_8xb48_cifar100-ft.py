# DeiT-B CIFAR-100 fine-tuning with every memory saving on one GPU's batch of 48: DropIT gamma 0.9,
# the fastest checkpoint plan within half of the activation peak, bfloat16 autocast, and 4
# micro-batches (12 images) per optimizer step; the effective batch stays 384 (8 x 48).
_base_ = ['./deit-b_dropit-mink0.9_8xb48_cifar100-ft.py']

custom_hooks = [
    dict(type='DropITHook', gamma=0.9, strategy='mink'),
    dict(type='CheckpointPlanHook', budget=0.5),
]
optim_wrapper = dict(type='MixedPrecisionOptimWrapper', dtype='bfloat16', micro_batches=4)
