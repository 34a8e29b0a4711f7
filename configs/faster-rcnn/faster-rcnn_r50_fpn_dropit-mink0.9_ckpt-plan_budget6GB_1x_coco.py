# Faster R-CNN R50-FPN on COCO with DropIT gamma 0.9 and the least-memory checkpoint plan, on GPUs
# with little memory: each batch runs as the fewest micro-batches whose measured peak fits 6 GB
# (chosen on the first iteration and logged), with one optimizer step per batch.
_base_ = ['./faster-rcnn_r50_fpn_dropit-mink0.9_ckpt-plan_1x_coco.py']

optim_wrapper = dict(type='MicroBatchOptimWrapper', memory_budget='6GB')
