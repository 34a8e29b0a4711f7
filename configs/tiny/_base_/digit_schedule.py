# 12 epochs on the digits-on-canvas set, CPU-sized (batch 2), for the tiny detectors.
_base_ = ['mmdet::_base_/schedules/schedule_1x.py', 'mmdet::_base_/default_runtime.py']

custom_imports = dict(imports=['mmdropit'], allow_failed_imports=False)

train_cfg = dict(max_epochs=12, val_interval=4)
optim_wrapper = dict(optimizer=dict(lr=0.01))
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=200),
    dict(type='MultiStepLR', begin=0, end=12, by_epoch=True, milestones=[8, 11], gamma=0.1),
]
auto_scale_lr = dict(enable=False, base_batch_size=2)
default_hooks = dict(logger=dict(interval=10))
