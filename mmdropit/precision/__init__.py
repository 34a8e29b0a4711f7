"""Mixed precision (pure PyTorch): the autocast dtype of a training step and the loss scaling
float16 needs, configured and checked once (:class:`MixedPrecisionConfig`)."""
from .config import DTYPES, MixedPrecisionConfig

__all__ = ['DTYPES', 'MixedPrecisionConfig']
