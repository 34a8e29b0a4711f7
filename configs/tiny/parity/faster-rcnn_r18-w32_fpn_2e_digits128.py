# Faster R-CNN of the parity suite (tools/parity.py --suite): a half-width ResNet-18 FPN on
# 128x128 digit canvases, 2 epochs of 500 canvases at batch 4 (about 0.07 s per image on one
# CPU core).
# python tools/train.py configs/tiny/parity/faster-rcnn_r18-w32_fpn_2e_digits128.py
_base_ = [
    'mmdet::_base_/models/faster-rcnn_r50_fpn.py',
    '../_base_/digit_coco128_detection.py',
    '../_base_/digit_schedule.py',
]

model = dict(
    # Trained from scratch: no stage frozen at its random init, BatchNorm statistics learnt.
    backbone=dict(depth=18, base_channels=32, frozen_stages=-1, norm_eval=False, init_cfg=None),
    neck=dict(in_channels=[32, 64, 128, 256], out_channels=64),
    rpn_head=dict(in_channels=64, feat_channels=64),
    roi_head=dict(
        # One bilinear sample per bin: RoIAlign's CPU backward dominates the step otherwise.
        bbox_roi_extractor=dict(out_channels=64, roi_layer=dict(sampling_ratio=1)),
        bbox_head=dict(in_channels=64, fc_out_channels=256, num_classes=10)),
    train_cfg=dict(
        rpn_proposal=dict(nms_pre=500, max_per_img=100), rcnn=dict(sampler=dict(num=32))),
    test_cfg=dict(rpn=dict(nms_pre=500, max_per_img=100), rcnn=dict(max_per_img=20)))

train_dataloader = dict(dataset=dict(indices=500))  # the first 500 of the 1,000 train canvases
train_cfg = dict(max_epochs=2, val_interval=2)
optim_wrapper = dict(optimizer=dict(lr=0.02))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=50),
    dict(type='CosineAnnealingLR', begin=0, end=2, by_epoch=True, convert_to_iter_based=True,
         eta_min=2e-4),
]
auto_scale_lr = dict(base_batch_size=4)
default_hooks = dict(logger=dict(interval=50))
