from .cls_data_preprocessor import ClsDataPreprocessor
from .timm_classifier import TimmClassifier

__all__ = ['ClsDataPreprocessor', 'TimmClassifier']
