# Faster R-CNN with a ResNet-18 FPN on the offline digits-on-canvas COCO set (CPU-sized).
# python tools/make_digit_coco.py --out data/digit_coco
# python tools/train.py configs/tiny/faster-rcnn_r18_fpn_digits.py
_base_ = [
    'mmdet::_base_/models/faster-rcnn_r50_fpn.py',
    './_base_/digit_coco_detection.py',
    './_base_/digit_schedule.py',
]

model = dict(
    backbone=dict(depth=18, init_cfg=None),  # no download: trained from scratch
    neck=dict(in_channels=[64, 128, 256, 512]),
    roi_head=dict(bbox_head=dict(num_classes=10)))
