"""Decide once per input-shape bucket: what the hooks that plan a training step share.

Multi-scale detection loads batches of several shapes; a plan made for one shape does not fit
another. :class:`ShapeBucketHook` keys its decisions by :func:`shape_key` (batch size, channels,
spatial sizes rounded up to ``bucket``), decides before the first iteration of each new bucket,
and switches decisions when the bucket of the batch changes. A bucket holds batches of several
sizes: a batch larger than the one its decision was made on (:func:`batch_extent`) has it made
again on that batch. Logs name both the real shape of
the batch a decision was made on and its bucket (:func:`bucket_text`); files and saved
decisions are named after the bucket alone (:func:`shape_text`). Under DDP or FSDP the processes
agree on one bucket each iteration (:func:`agreed_key`, the largest of their sizes), so that they
decide, and run the decision's collectives, together: one all-reduce of ten integers a step,
read on the host (MMEngine's ``RuntimeInfoHook`` reads the losses there every step anyway).
"""
from __future__ import annotations

import math
from collections.abc import Sequence

import torch
from mmengine.dist import all_reduce, is_distributed
from mmengine.logging import print_log

from ...errors import ConfigError
from .summary import SummaryHook

ShapeKey = tuple[int, ...]
_KEY_SIZES = 8
"""Sizes a key may hold in :func:`agreed_key` (batch, channels and up to six spatial sizes)."""


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


def batch_extent(inputs: object) -> int:
    """The elements of a data batch's inputs as the model gets them (a list of images padded
    to the largest of each size), which its activations grow with.

    Example:
        >>> batch_extent([torch.zeros(3, 600, 800), torch.zeros(3, 480, 820)])
        2952000
    """
    return math.prod(shape_key(inputs, bucket=1))


def agreed_key(key: ShapeKey, extent: int) -> tuple[ShapeKey, int]:
    """The bucket and batch extent every process uses: each the largest over the processes
    (as they are without a process group). Multi-scale detection pads each process's batch to
    its own images, so the processes of one iteration can fall into different buckets; a
    decision runs collectives, so all decide on one.

    Raises:
        ConfigError: ``key`` holds more sizes than an agreed key can.
    """
    if not is_distributed():
        return key, extent
    if len(key) > _KEY_SIZES:
        raise ConfigError(f'inputs of {len(key) - 2} spatial dimensions are more than shape '
                          f'buckets take under DDP / FSDP ({_KEY_SIZES - 2})')
    sizes = torch.zeros(2 + _KEY_SIZES, dtype=torch.int64)
    sizes[0], sizes[1] = len(key), extent
    sizes[2:2 + len(key)] = torch.tensor(key, dtype=torch.int64)
    all_reduce(sizes, op='max')
    length, largest, *values = sizes.tolist()
    return tuple(values[:length]), largest


def shape_text(key: ShapeKey) -> str:
    """How logs and file names show a bucket, e.g. ``'2x3x640x896'`` (``'any'`` for none)."""
    return 'x'.join(map(str, key)) or 'any'


def bucket_text(key: ShapeKey, inputs: object) -> str:
    """How logs name the batch ``inputs`` of the bucket ``key``: its real shape (batch size,
    channels and, for a list of images, the largest spatial sizes), then the bucket.

    Example:
        >>> batch = torch.zeros(32, 1, 28, 28)
        >>> bucket_text(shape_key(batch, bucket=128), batch)
        'inputs 32x1x28x28 (shape bucket 32x1x128x128)'
    """
    if not key:
        return 'inputs of any shape'
    return f'inputs {shape_text(shape_key(inputs, bucket=1))} (shape bucket {shape_text(key)})'


class ShapeBucketHook(SummaryHook):
    """A hook that makes one decision per input-shape bucket and trains with it.

    Subclasses implement :meth:`decide` (made before the first iteration of a new bucket, and
    again before one whose batch is larger than the one it was made on), :meth:`enter` and
    :meth:`leave` (put a decision in effect and take it away), and :meth:`decision_summary`
    (the decision of the first iteration's bucket, in the hook's summary line after that
    iteration); :meth:`forget` drops what they keep of a decision made again.

    Args:
        bucket: Spatial sizes are rounded up to a multiple of this before comparing shapes.

    Raises:
        ConfigError: ``bucket`` is not a positive int.

    Attributes:
        decisions: The decision of each bucket seen so far.
        described: Each bucket as logs name it (:func:`bucket_text` of the batch it was
            decided on).
        current: The bucket of the last batch (``None`` before the first).
    """

    def __init__(self, bucket: int = 128) -> None:
        if not isinstance(bucket, int) or bucket < 1:
            raise ConfigError(f'{type(self).__name__} bucket must be an int >= 1, got {bucket!r}')
        self.bucket = bucket
        self.decisions: dict[ShapeKey, object] = {}
        self.described: dict[ShapeKey, str] = {}
        self.extents: dict[ShapeKey, int] = {}
        self.current: ShapeKey | None = None

    def decide(self, runner, data_batch: dict, key: ShapeKey) -> object:
        """The decision for the bucket ``key``, made on ``data_batch`` (its logs name the
        bucket ``self.described[key]``)."""
        raise NotImplementedError

    def decision_summary(self, runner, key: ShapeKey, decision: object) -> str:
        """``decision``, the bucket ``key``'s, in a few words, for the summary line."""
        raise NotImplementedError

    def summary(self, runner) -> str | None:
        if self.current is None:
            return None
        key = self.current
        return f'{self.described[key]}: {self.decision_summary(runner, key, self.decisions[key])}'

    def enter(self, runner, decision: object) -> None:
        """Put ``decision`` in effect."""
        raise NotImplementedError

    def leave(self, runner, decision: object) -> None:
        """Take ``decision`` away."""
        raise NotImplementedError

    def forget(self, key: ShapeKey) -> None:
        """The bucket ``key``'s decision is made again: drop what was kept of the old one."""

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        if not isinstance(data_batch, dict):
            return
        inputs = data_batch.get('inputs')
        key, extent = agreed_key(shape_key(inputs, self.bucket), batch_extent(inputs))
        if key in self.decisions and extent > self.extents[key]:
            print_log(f'{type(self).__name__}: {bucket_text(key, inputs)} is '
                      f'{extent / self.extents[key]:.2f}x the batch its decision was made on '
                      f'({self.described[key]}): made again on it', logger='current')
            if self.current is not None:
                self.leave(runner, self.decisions[self.current])
            self.current = None
            del self.decisions[key]
            self.forget(key)
        if key == self.current:
            return
        if self.current is not None:
            self.leave(runner, self.decisions[self.current])
        if key not in self.decisions:
            self.described[key] = bucket_text(key, inputs)
            self.decisions[key] = self.decide(runner, data_batch, key)
            self.extents[key] = extent
        self.enter(runner, self.decisions[key])
        self.current = key
