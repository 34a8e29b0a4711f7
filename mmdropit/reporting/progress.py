"""The progress bar of the long tools (benchmark, parity): done / total, elapsed, time left.

Example::

    with progress_bar() as bar:
        task = bar.add_task('models', total=len(models))
        for model in models:
            print(measure(model))   # shown above the bar
            bar.advance(task)
"""
from __future__ import annotations

from rich.console import Console
from rich.progress import (BarColumn, MofNCompleteColumn, Progress, TimeElapsedColumn,
                           TimeRemainingColumn)


def progress_bar(console: Console | None = None) -> Progress:
    """A rich progress bar; lines printed while it is shown appear above it."""
    return Progress('[progress.description]{task.description}', BarColumn(),
                    MofNCompleteColumn(), TimeElapsedColumn(), 'left', TimeRemainingColumn(),
                    console=console)
