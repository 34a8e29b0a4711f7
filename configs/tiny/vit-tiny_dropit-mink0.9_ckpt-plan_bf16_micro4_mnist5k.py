# The tiny ViT with every memory saving, runnable on a CPU: DropIT gamma 0.9, the least-memory
# checkpoint plan, bfloat16 autocast and each batch of 32 as 4 micro-batches of 8.
# python tools/train.py configs/tiny/vit-tiny_dropit-mink0.9_ckpt-plan_bf16_micro4_mnist5k.py
_base_ = ['./vit-tiny_dropit-mink0.9_ckpt-plan_mnist5k.py']

optim_wrapper = dict(type='MixedPrecisionOptimWrapper', dtype='bfloat16', micro_batches=4)
