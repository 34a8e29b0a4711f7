# CIFAR-100 (the python pickle archive unpacked under data/cifar100), resized to 224x224.
dataset_type = 'CIFAR100Dataset'
data_root = 'data/cifar100'
train_pipeline = [
    dict(type='Resize', scale=(224, 224)),
    dict(type='RandomFlip', prob=0.5, direction='horizontal'),
    dict(type='PackClsInputs'),
]
test_pipeline = [dict(type='Resize', scale=(224, 224)), dict(type='PackClsInputs')]

train_dataloader = dict(
    batch_size=48,
    num_workers=8,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=True),
    dataset=dict(type=dataset_type, data_root=data_root, split='train', pipeline=train_pipeline))
val_dataloader = dict(
    batch_size=128,
    num_workers=8,
    persistent_workers=True,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type=dataset_type, data_root=data_root, split='test', pipeline=test_pipeline))
test_dataloader = val_dataloader
val_evaluator = dict(type='TopKAccuracy', topk=(1, 5))
test_evaluator = val_evaluator
