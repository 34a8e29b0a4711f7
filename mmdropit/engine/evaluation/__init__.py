from .accuracy import TopKAccuracy

__all__ = ['TopKAccuracy']
