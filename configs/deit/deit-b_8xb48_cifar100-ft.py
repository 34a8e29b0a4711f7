# DeiT-B fine-tuned on CIFAR-100 from the public DeiT ImageNet weights, the DropIT paper's
# baseline (top-1 90.8): the DeiT-S recipe (SGD, lr 0.01, weight decay 1e-4, batch 384) on DeiT-B.
# Weights: a local file, e.g. checkpoints/deit_base_patch16_224.pth (timm deit_base_patch16_224).
_base_ = ['./deit-s_8xb48_cifar100-ft.py']

model = dict(model_name='deit_base_patch16_224',
             pretrained_file='checkpoints/deit_base_patch16_224.pth')
