# DeiT-B CIFAR-100 fine-tuning with DropIT gamma 0.9 and FSDP2: parameters, gradients and SGD
# state sharded over the 8 processes (one shard unit per transformer block), full checkpoints.
# bash tools/dist_train.sh configs/deit/deit-b_dropit-mink0.9_fsdp_8xb48_cifar100-ft.py 8
_base_ = ['./deit-b_dropit-mink0.9_8xb48_cifar100-ft.py']

model_wrapper_cfg = dict(type='FullyShardModelWrapper')
custom_hooks = [
    dict(type='DropITHook', gamma=0.9, strategy='mink'),
    dict(type='FullyShardCheckpointHook'),
]
