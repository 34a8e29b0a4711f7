# Mask R-CNN R50-FPN on COCO (26 epochs) with DropIT gamma 0.8, the least-memory checkpoint plan
# (one plan per input-shape bucket of 128 px), and each batch run as the fewest micro-batches
# whose measured peak fits 6 GB (chosen on the first iteration and logged), one optimizer step
# per batch.
_base_ = ['./mask-rcnn_r50_fpn_dropit-mink0.8_26e_coco.py']

custom_hooks = [
    dict(type='DropITHook', gamma=0.8, strategy='mink'),
    dict(type='CheckpointPlanHook', budget=None, bucket=128),
]
optim_wrapper = dict(type='MicroBatchOptimWrapper', memory_budget='6GB')
