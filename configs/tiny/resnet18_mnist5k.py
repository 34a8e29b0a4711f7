# A small CNN (timm ResNet-18, one input channel) on real MNIST digits: the CNN counterpart of the
# tiny ViT, with BatchNorm and ReLU in front of every convolution.
# python tools/train.py configs/tiny/resnet18_mnist5k.py
_base_ = ['./_base_/mnist5k_classification.py', './_base_/default_runtime.py']

custom_imports = dict(imports=['mmdropit'], allow_failed_imports=False)

model = dict(
    type='TimmClassifier',
    model_name='resnet18',
    num_classes=10,
    in_chans=1,
    label_smoothing=0.1,
    data_preprocessor=dict(type='ClsDataPreprocessor', mean=[33.3], std=[78.6]))

optim_wrapper = dict(optimizer=dict(type='SGD', lr=0.05, momentum=0.9, weight_decay=1e-4))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=50),
    dict(type='CosineAnnealingLR', by_epoch=True, begin=0, end=4, eta_min=1e-4),
]
train_cfg = dict(by_epoch=True, max_epochs=4, val_interval=2)
val_cfg = dict()
test_cfg = dict()

custom_hooks = [dict(type='MemoryReportHook', interval=100)]
