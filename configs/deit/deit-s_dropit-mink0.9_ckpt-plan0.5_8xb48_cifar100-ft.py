# DeiT-S CIFAR-100 fine-tuning with DropIT gamma 0.9 and the fastest checkpoint plan whose
# activation peak is at most half of the (DropIT) model's unplanned one.
_base_ = ['./deit-s_dropit-mink0.9_8xb48_cifar100-ft.py']

custom_hooks = [
    dict(type='DropITHook', gamma=0.9, strategy='mink'),
    dict(type='CheckpointPlanHook', budget=0.5),
]
