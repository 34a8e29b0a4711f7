# Faster R-CNN R50-FPN on COCO with DropIT gamma 0.9 and the least-memory checkpoint plan.
# COCO's multi-scale inputs get one plan per input-shape bucket (rounded up to 128 px).
_base_ = ['./faster-rcnn_r50_fpn_dropit-mink0.9_1x_coco.py']

custom_hooks = [
    dict(type='DropITHook', gamma=0.9, strategy='mink'),
    dict(type='CheckpointPlanHook', budget=None, bucket=128),
]
