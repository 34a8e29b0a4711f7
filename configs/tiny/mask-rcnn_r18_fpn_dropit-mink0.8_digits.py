# The tiny Mask R-CNN with DropIT gamma 0.8 (the paper's Mask R-CNN setting).
# python tools/train.py configs/tiny/mask-rcnn_r18_fpn_dropit-mink0.8_digits.py
_base_ = ['./mask-rcnn_r18_fpn_digits.py']

custom_hooks = [dict(type='DropITHook', gamma=0.8, strategy='mink')]
