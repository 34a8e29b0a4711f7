# The small CNN of the parity suite (tools/parity.py --suite): resnet18_mnist5k in one epoch
# (cosine to the end), about 45 s on one CPU core.
# python tools/train.py configs/tiny/parity/resnet18_1e_mnist5k.py
_base_ = ['../resnet18_mnist5k.py']

param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=50),
    dict(type='CosineAnnealingLR', by_epoch=True, begin=0, end=1, eta_min=1e-4,
         convert_to_iter_based=True),
]
train_cfg = dict(max_epochs=1, val_interval=1)
