# The tiny ViT with DropIT (gamma 0.9, exact min-k) on each Linear but the patch embedding and head.
# python tools/train.py configs/tiny/vit-tiny_dropit-mink0.9_mnist5k.py
_base_ = ['./vit-tiny_mnist5k.py']

custom_hooks = [
    dict(type='DropITHook', gamma=0.9, strategy='mink', audit=True),
    dict(type='MemoryReportHook', interval=100),
]
