# Faster R-CNN R50-FPN on COCO (26 epochs) with DropIT gamma 0.9 and FSDP2: parameters, gradients
# and SGD state sharded over the 8 processes, one shard unit per ResNet stage (the frozen stem and
# first stage included), the rest (FPN, heads) in the root unit; full checkpoints by rank 0.
# bash tools/dist_train.sh configs/faster-rcnn/faster-rcnn_r50_fpn_dropit-mink0.9_fsdp_26e_coco.py 8
_base_ = ['./faster-rcnn_r50_fpn_dropit-mink0.9_26e_coco.py']

model_wrapper_cfg = dict(type='FullyShardModelWrapper')
custom_hooks = [
    dict(type='DropITHook', gamma=0.9, strategy='mink'),
    dict(type='FullyShardCheckpointHook'),
]
