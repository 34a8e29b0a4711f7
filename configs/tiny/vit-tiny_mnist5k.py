# A 4-block ViT (patch 7, width 96) on real MNIST digits: about a minute on 2 CPU cores, ~91% top-1.
# python tools/train.py configs/tiny/vit-tiny_mnist5k.py
_base_ = ['./_base_/mnist5k_classification.py', './_base_/default_runtime.py']

custom_imports = dict(imports=['mmdropit'], allow_failed_imports=False)

model = dict(
    type='TimmClassifier',
    model_name='vit_tiny_patch16_224',
    num_classes=10,
    img_size=28,
    patch_size=7,
    in_chans=1,
    embed_dim=96,
    depth=4,
    num_heads=3,
    label_smoothing=0.1,
    data_preprocessor=dict(type='ClsDataPreprocessor', mean=[33.3], std=[78.6]))

optim_wrapper = dict(
    optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.05),
    clip_grad=dict(max_norm=1.0))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=50),
    dict(type='CosineAnnealingLR', by_epoch=True, begin=0, end=8, eta_min=1e-5),
]
train_cfg = dict(by_epoch=True, max_epochs=8, val_interval=2)
val_cfg = dict()
test_cfg = dict()

custom_hooks = [dict(type='MemoryReportHook', interval=100)]
