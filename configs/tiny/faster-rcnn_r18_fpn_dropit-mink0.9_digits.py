# The tiny Faster R-CNN with DropIT gamma 0.9 (the paper's Faster R-CNN setting).
# python tools/train.py configs/tiny/faster-rcnn_r18_fpn_dropit-mink0.9_digits.py
_base_ = ['./faster-rcnn_r18_fpn_digits.py']

custom_hooks = [dict(type='DropITHook', gamma=0.9, strategy='mink')]
