# DeiT-Ti from scratch on ImageNet-1k with DropIT gamma 0.7 and FSDP2: parameters, gradients and
# AdamW state sharded over the 8 processes (one shard unit per transformer block), full
# checkpoints written by rank 0.
# bash tools/dist_train.sh configs/deit/deit-ti_dropit-mink0.7_fsdp_8xb128_in1k.py 8
_base_ = ['./deit-ti_dropit-mink0.7_8xb128_in1k.py']

model_wrapper_cfg = dict(type='FullyShardModelWrapper')
custom_hooks = [
    dict(type='DropITHook', gamma=0.7, strategy='mink'),
    dict(type='FullyShardCheckpointHook'),
]
