# DeiT-S fine-tuned on CIFAR-100 from the public DeiT ImageNet weights (the DropIT paper's setting:
# SGD, lr 0.01, weight decay 1e-4, batch 384 = 8 GPUs x 48).
# Weights: a local file, e.g. checkpoints/deit_small_patch16_224.pth (timm deit_small_patch16_224).
# bash tools/dist_train.sh configs/deit/deit-s_8xb48_cifar100-ft.py 8
_base_ = ['../_base_/cifar100_224.py', '../tiny/_base_/default_runtime.py']

custom_imports = dict(imports=['mmdropit'], allow_failed_imports=False)

model = dict(
    type='TimmClassifier',
    model_name='deit_small_patch16_224',
    num_classes=100,
    pretrained_file='checkpoints/deit_small_patch16_224.pth',
    data_preprocessor=dict(type='ClsDataPreprocessor'))

optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.01, momentum=0.9, weight_decay=1e-4))
param_scheduler = [dict(type='CosineAnnealingLR', by_epoch=True, begin=0, end=20, eta_min=0)]
train_cfg = dict(by_epoch=True, max_epochs=20, val_interval=1)
val_cfg = dict()
test_cfg = dict()
default_hooks = dict(logger=dict(interval=50))
auto_scale_lr = dict(base_batch_size=384)
