"""timm image classification under MMEngine, with no mmpretrain: the model, its data
preprocessor (with Mixup / CutMix), the datasets and pipeline steps, and the top-k metric.

Example config::

    model = dict(type='TimmClassifier', model_name='deit_tiny_patch16_224', num_classes=10,
                 img_size=28, in_chans=1, patch_size=7,
                 data_preprocessor=dict(type='ClsDataPreprocessor', mean=[33.3], std=[78.6]))
    train_dataloader = dict(batch_size=32, dataset=dict(
        type='MNIST5kDataset', split='train', pipeline=[dict(type='PackClsInputs')]))
    val_evaluator = dict(type='TopKAccuracy', topk=(1, ))
"""
from .accuracy import TopKAccuracy
from .cifar100 import CIFAR100Dataset
from .cls_data_preprocessor import ClsDataPreprocessor
from .image_folder import ImageFolderDataset
from .mnist5k import MNIST5kDataset
from .pack_cls_inputs import PackClsInputs
from .timm_classifier import TimmClassifier
from .timm_transform import TimmTransform

__all__ = ['CIFAR100Dataset', 'ClsDataPreprocessor', 'ImageFolderDataset', 'MNIST5kDataset',
           'PackClsInputs', 'TimmClassifier', 'TimmTransform', 'TopKAccuracy']
