# Digits on 128x128 canvases (1-3 digits of 28-45 px): the parity suite's detection set, small
# enough for 24 detector trainings on a 2-core CPU.
# python tools/make_digit_coco.py --out data/digit_coco128 --canvas 128 --scale 1.0 1.6 \
#     --digits-per-image 1 3
_base_ = ['./digit_coco_detection.py']

data_root = 'data/digit_coco128/'
train_pipeline = [
    dict(type='LoadImageFromFile', backend_args=None),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='Resize', scale=(128, 128), keep_ratio=True),  # sets scale_factor (here 1)
    dict(type='PackDetInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile', backend_args=None),
    dict(type='Resize', scale=(128, 128), keep_ratio=True),
    dict(type='LoadAnnotations', with_bbox=True),
    dict(type='PackDetInputs',
         meta_keys=('img_id', 'img_path', 'ori_shape', 'img_shape', 'scale_factor')),
]
train_dataloader = dict(batch_size=4, dataset=dict(data_root=data_root, pipeline=train_pipeline))
val_dataloader = dict(batch_size=4, dataset=dict(data_root=data_root, pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(ann_file=data_root + 'annotations/instances_val.json')
test_evaluator = val_evaluator
