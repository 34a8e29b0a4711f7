# The DropIT paper's detection schedule: 26 epochs, learning rate x0.1 after epochs 16 and 22
# (MMDetection's 2x schedule runs 24), SGD lr 0.02 for 16 images per step.
_base_ = ['mmdet::_base_/schedules/schedule_2x.py']

train_cfg = dict(max_epochs=26)
param_scheduler = [
    dict(type='LinearLR', start_factor=0.001, by_epoch=False, begin=0, end=500),
    dict(type='MultiStepLR', begin=0, end=26, by_epoch=True, milestones=[16, 22], gamma=0.1),
]
