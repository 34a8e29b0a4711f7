# The small CNN with DropIT (gamma 0.9) and 1-bit ReLUs, so each convolution input is really freed.
# python tools/train.py configs/tiny/resnet18_dropit-mink0.9_mnist5k.py
_base_ = ['./resnet18_mnist5k.py']

custom_hooks = [
    dict(type='DropITHook', gamma=0.9, strategy='mink', audit=True),
    dict(type='MemoryReportHook', interval=100),
]
