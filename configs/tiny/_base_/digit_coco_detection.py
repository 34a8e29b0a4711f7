# Digits on canvas: real MNIST-5k digits pasted on 256x256 canvases, in COCO format (offline).
# Make the data first:  python tools/make_digit_coco.py --out data/digit_coco
# Classes are the digit names '0'..'9' (COCO category ids 1..10); CocoDataset maps them by name.
#
# Mask R-CNN: the annotations also hold the stroke masks (COCO RLE). In the model config, load
# them and evaluate segm; the pipelines must be passed again because a base config's variables
# are substituted when the base is read:
#   train_pipeline = [
#       dict(type='LoadImageFromFile', backend_args=None),
#       dict(type='LoadAnnotations', with_bbox=True, with_mask=True),
#       dict(type='Resize', scale=(256, 256), keep_ratio=True),
#       dict(type='PackDetInputs')]
#   train_dataloader = dict(dataset=dict(pipeline=train_pipeline))
#   (the same for test_pipeline with with_mask=True, then val_dataloader / test_dataloader)
#   val_evaluator = dict(metric=['bbox', 'segm'])
#   test_evaluator = val_evaluator
# A child that moves data_root must also reset the evaluators' ann_file.
dataset_type = 'CocoDataset'
data_root = 'data/digit_coco/'
metainfo = dict(classes=('0', '1', '2', '3', '4', '5', '6', '7', '8', '9'))
backend_args = None

# No RandomFlip: a mirrored digit is not the same digit.
train_pipeline = [
    dict(type='LoadImageFromFile', backend_args=backend_args),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='Resize', scale=(256, 256), keep_ratio=True),
    dict(type='PackDetInputs')
]
test_pipeline = [
    dict(type='LoadImageFromFile', backend_args=backend_args),
    dict(type='Resize', scale=(256, 256), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(
        type='PackDetInputs',
        meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor'))
]
train_dataloader = dict(
    batch_size=2,
    num_workers=0,
    persistent_workers=False,
    sampler=dict(type='DefaultSampler', shuffle=True),
    batch_sampler=dict(type='AspectRatioBatchSampler'),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        metainfo=metainfo,
        ann_file='annotations/instances_train.json',
        data_prefix=dict(img='train/'),
        filter_cfg=dict(filter_empty_gt=True),
        pipeline=train_pipeline,
        backend_args=backend_args))
val_dataloader = dict(
    batch_size=2,
    num_workers=0,
    persistent_workers=False,
    drop_last=False,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(
        type=dataset_type,
        data_root=data_root,
        metainfo=metainfo,
        ann_file='annotations/instances_val.json',
        data_prefix=dict(img='val/'),
        test_mode=True,
        pipeline=test_pipeline,
        backend_args=backend_args))
test_dataloader = val_dataloader

val_evaluator = dict(
    type='CocoMetric',
    ann_file=data_root + 'annotations/instances_val.json',
    metric='bbox',
    format_only=False,
    backend_args=backend_args)
test_evaluator = val_evaluator
