# The small CNN of the parity suite (tools/parity.py --suite): resnet18_mnist5k in 2 epochs,
# about 80 s on one CPU core.
# python tools/train.py configs/tiny/parity/resnet18_2e_mnist5k.py
_base_ = ['../resnet18_mnist5k.py']

param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=50),
    dict(type='CosineAnnealingLR', by_epoch=True, begin=0, end=2, eta_min=1e-4),
]
train_cfg = dict(max_epochs=2, val_interval=2)
