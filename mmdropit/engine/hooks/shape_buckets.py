"""Decide once per input-shape bucket: what the hooks that plan a training step share.

Multi-scale detection loads batches of several shapes; a plan made for one shape does not fit
another. :class:`ShapeBucketHook` keys its decisions by :func:`shape_key` (batch size, channels,
spatial sizes rounded up to ``bucket``), decides before the first iteration of each new bucket,
and switches decisions when the bucket of the batch changes.
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from mmengine.hooks import Hook

from ...errors import ConfigError

ShapeKey = tuple[int, ...]


def shape_key(inputs: object, bucket: int) -> ShapeKey:
    """Batch size, channels and the spatial sizes rounded up to ``bucket`` of a data batch's
    inputs (a stacked tensor, or a list of images as mmdet loads them).

    Example:
        >>> shape_key([torch.zeros(3, 600, 800), torch.zeros(3, 480, 820)], bucket=128)
        (2, 3, 640, 896)
    """
    if isinstance(inputs, torch.Tensor):
        batch, *shape = inputs.shape
    elif isinstance(inputs, Sequence) and inputs and all(isinstance(t, torch.Tensor)
                                                           for t in inputs):
        batch, shape = len(inputs), [max(sizes) for sizes in zip(*(t.shape for t in inputs))]
    else:
        return ()
    spatial = [bucket * math.ceil(size / bucket) for size in shape[1:]]
    return (batch, *shape[:1], *spatial)


def shape_text(key: ShapeKey) -> str:
    """How logs and file names show a bucket, e.g. ``'2x3x640x896'`` (``'any'`` for none)."""
    return 'x'.join(map(str, key)) or 'any'


class ShapeBucketHook(Hook):
    """A hook that makes one decision per input-shape bucket and trains with it.

    Subclasses implement :meth:`decide` (made before the first iteration of a new bucket),
    :meth:`enter` and :meth:`leave` (put a decision in effect and take it away).

    Args:
        bucket: Spatial sizes are rounded up to a multiple of this before comparing shapes.

    Raises:
        ConfigError: ``bucket`` is not a positive int.

    Attributes:
        decisions: The decision of each bucket seen so far.
        current: The bucket of the last batch (``None`` before the first).
    """

    def __init__(self, bucket: int = 128) -> None:
        if not isinstance(bucket, int) or bucket < 1:
            raise ConfigError(f'{type(self).__name__} bucket must be an int >= 1, got {bucket!r}')
        self.bucket = bucket
        self.decisions: dict[ShapeKey, object] = {}
        self.current: ShapeKey | None = None

    def decide(self, runner, data_batch: dict, key: ShapeKey) -> object:
        """The decision for the bucket ``key``, made on ``data_batch``."""
        raise NotImplementedError

    def enter(self, runner, decision: object) -> None:
        """Put ``decision`` in effect."""
        raise NotImplementedError

    def leave(self, runner, decision: object) -> None:
        """Take ``decision`` away."""
        raise NotImplementedError

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        if not isinstance(data_batch, dict):
            return
        key = shape_key(data_batch.get('inputs'), self.bucket)
        if key == self.current:
            return
        if self.current is not None:
            self.leave(runner, self.decisions[self.current])
        if key not in self.decisions:
            self.decisions[key] = self.decide(runner, data_batch, key)
        self.enter(runner, self.decisions[key])
        self.current = key
