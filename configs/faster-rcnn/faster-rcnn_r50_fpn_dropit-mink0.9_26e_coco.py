# Faster R-CNN R50-FPN on COCO with DropIT gamma 0.9, the paper's schedule (box AP 37.0 -> 37.2).
# The stem convolution and the box predictors (rpn_cls/rpn_reg, fc_cls/fc_reg) stay exact.
_base_ = ['./faster-rcnn_r50_fpn_26e_coco.py']

custom_imports = dict(imports=['mmdropit'], allow_failed_imports=False)
custom_hooks = [dict(type='DropITHook', gamma=0.9, strategy='mink')]
