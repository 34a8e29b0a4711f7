"""What the long tools print and write beside their figures: a progress bar, and where and when
the figures were measured."""
from .progress import progress_bar
from .provenance import provenance, provenance_markdown

__all__ = ['progress_bar', 'provenance', 'provenance_markdown']
