# Mask R-CNN with a ResNet-18 FPN on the offline digits-on-canvas COCO set (boxes and stroke masks).
# python tools/make_digit_coco.py --out data/digit_coco
# python tools/train.py configs/tiny/mask-rcnn_r18_fpn_digits.py
_base_ = [
    'mmdet::_base_/models/mask-rcnn_r50_fpn.py',
    './_base_/digit_coco_detection.py',
    './_base_/digit_schedule.py',
]

# CPU-sized: 128-channel FPN and heads, fewer proposals and RoIs (a canvas holds <= 4 digits).
model = dict(
    backbone=dict(depth=18, init_cfg=None),  # no download: trained from scratch
    neck=dict(in_channels=[64, 128, 256, 512], out_channels=128),
    rpn_head=dict(in_channels=128, feat_channels=128),
    roi_head=dict(
        bbox_roi_extractor=dict(out_channels=128),
        bbox_head=dict(in_channels=128, fc_out_channels=512, num_classes=10),
        mask_roi_extractor=dict(out_channels=128),
        mask_head=dict(in_channels=128, conv_out_channels=128, num_classes=10)),
    train_cfg=dict(
        rpn_proposal=dict(nms_pre=1000, max_per_img=300), rcnn=dict(sampler=dict(num=128))),
    test_cfg=dict(rpn=dict(nms_pre=500, max_per_img=100), rcnn=dict(max_per_img=20)))

train_pipeline = [
    dict(type='LoadImageFromFile', backend_args=None),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='Resize', scale=(256, 256), keep_ratio=True),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile', backend_args=None),
    dict(type='Resize', scale=(256, 256), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(metric=['bbox', 'segm'])
test_evaluator = val_evaluator
