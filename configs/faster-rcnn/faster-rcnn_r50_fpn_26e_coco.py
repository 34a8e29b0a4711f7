# Faster R-CNN R50-FPN on COCO, the DropIT paper's baseline (box AP 37.0): 26 epochs, steps at 16
# and 22, 16 images per step (bash tools/dist_train.sh CONFIG 8: 8 GPUs x 2 images).
_base_ = [
    'mmdet::_base_/models/faster-rcnn_r50_fpn.py', 'mmdet::_base_/datasets/coco_detection.py',
    '../_base_/schedule_26e.py', 'mmdet::_base_/default_runtime.py'
]
