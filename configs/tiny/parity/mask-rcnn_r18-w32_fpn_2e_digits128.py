# Mask R-CNN of the parity suite (tools/parity.py --suite): the parity Faster R-CNN plus a
# small mask head, trained on boxes and stroke masks, evaluated on bbox and segm AP.
# python tools/train.py configs/tiny/parity/mask-rcnn_r18-w32_fpn_2e_digits128.py
_base_ = ['./faster-rcnn_r18-w32_fpn_2e_digits128.py']

# The mask branch of mmdet's mask-rcnn_r50_fpn with 2 convolutions of 64 channels (not 4 of 256).
model = dict(
    type='MaskRCNN',
    roi_head=dict(
        mask_roi_extractor=dict(
            type='SingleRoIExtractor',
            roi_layer=dict(type='RoIAlign', output_size=14, sampling_ratio=1),
            out_channels=64,
            featmap_strides=[4, 8, 16, 32]),
        mask_head=dict(
            type='FCNMaskHead',
            num_convs=2,
            in_channels=64,
            conv_out_channels=64,
            num_classes=10,
            loss_mask=dict(type='CrossEntropyLoss', use_mask=True, loss_weight=1.0))),
    train_cfg=dict(rcnn=dict(mask_size=28)),
    test_cfg=dict(rcnn=dict(mask_thr_binary=0.5)))

train_pipeline = [
    dict(type='LoadImageFromFile', backend_args=None),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='Resize', scale=(128, 128), keep_ratio=True),
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile', backend_args=None),
    dict(type='Resize', scale=(128, 128), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
val_dataloader = dict(dataset=dict(pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(metric=['bbox', 'segm'])
test_evaluator = val_evaluator
