from .cifar100 import CIFAR100Dataset
from .image_folder import ImageFolderDataset
from .mnist5k import MNIST5kDataset
from .pack_cls_inputs import PackClsInputs
from .timm_transform import TimmTransform

__all__ = ['CIFAR100Dataset', 'ImageFolderDataset', 'MNIST5kDataset', 'PackClsInputs',
           'TimmTransform']
