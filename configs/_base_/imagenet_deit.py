# ImageNet-1k as class folders (data/imagenet/{train,val}/<wnid>/*.JPEG) with DeiT's data recipe
# through timm: random resized crop, flip, RandAugment rand-m9-mstd0.5-inc1, colour jitter 0.4,
# random erasing 0.25 (pixel mode); evaluation resizes to 248 and centre-crops 224 (crop_pct
# 0.875), bicubic. Mixup 0.8 / CutMix 1.0 with label smoothing 0.1 live in the model's
# data_preprocessor (see configs/deit/deit-ti_8xb128_in1k.py). The val folder must use the
# train folder's class names (the usual "valprep" layout).
dataset_type = 'ImageFolderDataset'
data_root = 'data/imagenet'
train_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='TimmTransform', is_training=True, input_size=224, color_jitter=0.4,
         auto_augment='rand-m9-mstd0.5-inc1', interpolation='bicubic', re_prob=0.25,
         re_mode='pixel', re_count=1),
    dict(type='PackClsInputs'),
]
test_pipeline = [
    dict(type='LoadImageFromFile'),
    dict(type='TimmTransform', input_size=224, crop_pct=0.875, interpolation='bicubic'),
    dict(type='PackClsInputs'),
]

train_dataloader = dict(
    batch_size=128,
    num_workers=10,
    persistent_workers=True,
    drop_last=True,  # Mixup needs an even batch
    sampler=dict(type='DefaultSampler', shuffle=True),
    dataset=dict(type=dataset_type, data_root=data_root, split='train', pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=256,
    num_workers=10,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type=dataset_type, data_root=data_root, split='val', pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(type='TopKAccuracy', topk=(1, 5))
test_evaluator = val_evaluator
