# The tiny ViT with DropIT gamma 0.7, the paper's largest gamma for training a ViT from scratch
# (DeiT-Ti on ImageNet: 0.5 / 0.6 / 0.7); gamma 0.9 is its fine-tuning setting.
# python tools/train.py configs/tiny/vit-tiny_dropit-mink0.7_mnist5k.py
_base_ = ['./vit-tiny_dropit-mink0.9_mnist5k.py']

custom_hooks = [
    dict(type='DropITHook', gamma=0.7, strategy='mink', audit=True),
    dict(type='MemoryReportHook', interval=100),
]
