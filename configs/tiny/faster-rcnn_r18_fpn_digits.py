# Faster R-CNN with a ResNet-18 FPN on the offline digits-on-canvas COCO set (CPU-sized).
# python tools/make_digit_coco.py --out data/digit_coco
# python tools/train.py configs/tiny/faster-rcnn_r18_fpn_digits.py
_base_ = [
    'mmdet::_base_/models/faster-rcnn_r50_fpn.py',
    './_base_/digit_coco_detection.py',
    './_base_/digit_schedule.py',
]

# CPU-sized: 128-channel FPN and heads, fewer proposals and RoIs (a canvas holds <= 4 digits);
# about 4x faster per iteration than the R50-FPN defaults with the same backbone.
model = dict(
    backbone=dict(depth=18, init_cfg=None),  # no download: trained from scratch
    neck=dict(in_channels=[64, 128, 256, 512], out_channels=128),
    rpn_head=dict(in_channels=128, feat_channels=128),
    roi_head=dict(
        bbox_roi_extractor=dict(out_channels=128),
        bbox_head=dict(in_channels=128, fc_out_channels=512, num_classes=10)),
    train_cfg=dict(
        rpn_proposal=dict(nms_pre=1000, max_per_img=300), rcnn=dict(sampler=dict(num=128))),
    test_cfg=dict(rpn=dict(nms_pre=500, max_per_img=100), rcnn=dict(max_per_img=20)))
