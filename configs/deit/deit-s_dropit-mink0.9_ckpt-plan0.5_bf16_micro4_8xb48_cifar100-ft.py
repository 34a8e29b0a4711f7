# DeiT-S CIFAR-100 fine-tuning with every memory saving on one GPU's batch of 48: DropIT gamma 0.9,
# the fastest checkpoint plan within half of the activation peak, bfloat16 autocast, and each
# batch run as 4 micro-batches (12 images) with one optimizer step: the effective batch is still
# 384 (8 x 48), so the learning rate and schedule stay as published.
_base_ = ['./deit-s_dropit-mink0.9_ckpt-plan0.5_8xb48_cifar100-ft.py']

optim_wrapper = dict(type='MixedPrecisionOptimWrapper', dtype='bfloat16', micro_batches=4)
