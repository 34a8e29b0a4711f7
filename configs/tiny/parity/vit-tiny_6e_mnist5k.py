# The tiny ViT of the parity suite (tools/parity.py --suite): vit-tiny_mnist5k in 6 epochs
# (cosine to the end) instead of 8, so that 12 runs of it fit the suite's time.
# python tools/train.py configs/tiny/parity/vit-tiny_6e_mnist5k.py
_base_ = ['../vit-tiny_mnist5k.py']

param_scheduler = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=50),
    dict(type='CosineAnnealingLR', by_epoch=True, begin=0, end=6, eta_min=1e-5),
]
train_cfg = dict(by_epoch=True, max_epochs=6, val_interval=6)
