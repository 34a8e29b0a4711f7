# DeiT-Ti from scratch on ImageNet-1k with DropIT gamma 0.7 (paper: 72.1 -> 72.1 top-1).
# The patch embedding and the classifier head stay exact (DropITHook's defaults).
_base_ = ['./deit-ti_8xb128_in1k.py']

custom_hooks = [dict(type='DropITHook', gamma=0.7, strategy='mink')]
