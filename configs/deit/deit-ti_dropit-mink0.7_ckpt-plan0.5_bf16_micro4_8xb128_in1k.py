# DeiT-Ti from scratch on ImageNet-1k with every memory saving on one GPU's batch of 128: DropIT
# gamma 0.7, the fastest checkpoint plan within half of the activation peak, bfloat16 autocast,
# and each batch run as 4 micro-batches (32 images) with one optimizer step, so the effective
# batch stays 1024. Mixup / CutMix run in the data preprocessor, i.e. per micro-batch of 32 (an
# even size), each with its own mixing factor where DeiT draws one per batch of 128.
_base_ = ['./deit-ti_dropit-mink0.7_8xb128_in1k.py']

custom_hooks = [
    dict(type='DropITHook', gamma=0.7, strategy='mink'),
    dict(type='CheckpointPlanHook', budget=0.5),
]
optim_wrapper = dict(type='MixedPrecisionOptimWrapper', dtype='bfloat16', micro_batches=4)
