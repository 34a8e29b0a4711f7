# DeiT-Ti trained from scratch on ImageNet-1k (DropIT paper baseline: 72.1 top-1), DeiT's recipe:
# 300 epochs, AdamW lr 5e-4 x batch / 512 (batch 1024 = 8 GPUs x 128), weight decay 0.05 (none
# on norms, biases, position embedding and class token), 5 warm-up epochs, cosine to 1e-5,
# drop path 0.1, RandAugment, random erasing, Mixup 0.8 / CutMix 1.0, label smoothing 0.1.
# Not reproduced: DeiT's repeated augmentation sampler (3 repeats per batch).
# bash tools/dist_train.sh configs/deit/deit-ti_8xb128_in1k.py 8
_base_ = ['../_base_/imagenet_deit.py', '../tiny/_base_/default_runtime.py']

custom_imports = dict(imports=['mmdropit'], allow_failed_imports=False)

model = dict(
    type='TimmClassifier',
    model_name='deit_tiny_patch16_224',
    num_classes=1000,
    drop_path_rate=0.1,
    # TimmTransform already normalised the images; Mixup / CutMix make the soft targets.
    data_preprocessor=dict(
        type='ClsDataPreprocessor', mean=None, std=None, bgr_to_rgb=False,
        mixup=dict(mixup_alpha=0.8, cutmix_alpha=1.0, label_smoothing=0.1, num_classes=1000)))

optim_wrapper = dict(
    optimizer=dict(type='AdamW', lr=5e-4 * 1024 / 512, weight_decay=0.05),
    paramwise_cfg=dict(norm_decay_mult=0.0, bias_decay_mult=0.0, custom_keys={
        '.pos_embed': dict(decay_mult=0.0), '.cls_token': dict(decay_mult=0.0)}))
param_scheduler = [
    dict(type='LinearLR', start_factor=1e-3, by_epoch=True, begin=0, end=5,
         convert_to_iter_based=True),
    dict(type='CosineAnnealingLR', by_epoch=True, begin=5, end=300, eta_min=1e-5,
         convert_to_iter_based=True),
]
train_cfg = dict(by_epoch=True, max_epochs=300, val_interval=10)
val_cfg = dict()
test_cfg = dict()
default_hooks = dict(logger=dict(interval=100), checkpoint=dict(interval=10, max_keep_ckpts=3))
auto_scale_lr = dict(base_batch_size=1024)
