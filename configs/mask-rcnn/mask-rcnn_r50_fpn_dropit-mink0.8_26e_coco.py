# Mask R-CNN R50-FPN on COCO with DropIT gamma 0.8, the paper's schedule (box / mask AP
# 37.9 / 34.5 -> 38.5 / 34.5). The stem and the predictors stay exact.
_base_ = ['./mask-rcnn_r50_fpn_26e_coco.py']

custom_imports = dict(imports=['mmdropit'], allow_failed_imports=False)
custom_hooks = [dict(type='DropITHook', gamma=0.8, strategy='mink')]
