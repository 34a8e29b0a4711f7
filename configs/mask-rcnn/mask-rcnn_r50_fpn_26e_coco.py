# Mask R-CNN R50-FPN on COCO, the DropIT paper's baseline (box / mask AP 37.9 / 34.5): 26 epochs,
# steps at 16 and 22, 16 images per step (bash tools/dist_train.sh CONFIG 8).
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py', 'mmdet::_base_/datasets/coco_instance.py',
    '../_base_/schedule_26e.py', 'mmdet::_base_/default_runtime.py'
]
