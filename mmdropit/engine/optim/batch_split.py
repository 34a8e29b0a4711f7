"""Split a loaded batch into micro-batches and merge their log variables back.

A batch is what MMEngine's collate functions return for dict samples: a dict whose values are
tensors (batch first, from ``default_collate``), lists with one entry per sample (inputs and data
samples from ``pseudo_collate``), or dicts of those. Anything else is copied to every micro-batch.

Example:
    >>> batch = dict(inputs=[torch.zeros(3, 8, 8)] * 5, labels=torch.arange(5), scale=2)
    >>> parts = split_batch(batch, [3, 2])
    >>> [len(part['inputs']) for part in parts], parts[1]['labels'].tolist(), parts[1]['scale']
    ([3, 2], [3, 4], 2)
    >>> merge_log_vars([dict(loss=torch.tensor(1.0)), dict(loss=torch.tensor(4.0))], [3, 1])
    {'loss': tensor(1.7500)}
"""
from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from ...errors import ConfigError

_HELP = ('micro-batching splits batches that are dicts of tensors (batch first) and per-sample '
         'lists, as MMEngine\'s pseudo_collate and default_collate make them')


def _batch_sizes(value: Any) -> list[int]:
    if isinstance(value, torch.Tensor):
        return [value.shape[0]] if value.dim() else []
    if isinstance(value, (list, tuple)):
        return [len(value)]
    if isinstance(value, dict):
        return [size for item in value.values() for size in _batch_sizes(item)]
    return []


def batch_size_of(data: Any) -> int:
    """The number of samples in ``data``.

    Raises:
        ConfigError: ``data`` is not a dict, holds nothing per sample, or its fields disagree.
    """
    if not isinstance(data, dict):
        raise ConfigError(f'{_HELP}; got a {type(data).__name__}')
    sizes = set(_batch_sizes(data))
    if len(sizes) != 1:
        raise ConfigError(f'{_HELP}; the fields of this batch hold {sorted(sizes)} samples')
    return sizes.pop()


def _split(value: Any, sizes: Sequence[int]) -> list[Any]:
    if isinstance(value, torch.Tensor) and value.dim():
        return list(torch.split(value, list(sizes)))
    if isinstance(value, (list, tuple)):
        starts = [sum(sizes[:index]) for index in range(len(sizes))]
        return [type(value)(value[start:start + size]) for start, size in zip(starts, sizes)]
    if isinstance(value, dict):
        parts = {key: _split(item, sizes) for key, item in value.items()}
        return [type(value)((key, parts[key][index]) for key in value)
                for index in range(len(sizes))]
    return [value] * len(sizes)


def split_batch(data: dict, sizes: Sequence[int]) -> list[dict]:
    """Split ``data`` into consecutive parts of ``sizes`` samples (they must add up)."""
    total = batch_size_of(data)
    if sum(sizes) != total:
        raise ValueError(f'micro-batch sizes {list(sizes)} do not add up to {total} samples')
    return _split(data, sizes)


def first_samples(data: dict, size: int) -> dict:
    """The batch's first ``size`` samples (``data`` itself when that is all of them)."""
    batch_size = batch_size_of(data)
    return split_batch(data, [size, batch_size - size])[0] if size < batch_size else data


def largest_first(data: dict) -> dict:
    """``data`` with its samples reordered for trial passes of a few samples: where its
    ``inputs`` are images of several sizes (mmdet pads each batch to its largest), the largest
    image first, then each time the one that pads the images before it largest (ties: the
    larger image), so that a trial of the first samples is as heavy as a part of their size
    can be (two that hold the tallest and the widest pad to the whole batch's shape); ``data``
    itself otherwise.

    Example:
        >>> batch = dict(inputs=[torch.zeros(3, 4, 9), torch.zeros(3, 8, 5), torch.zeros(3, 6, 6)],
        ...              ids=torch.arange(3))
        >>> largest_first(batch)['ids'].tolist()
        [1, 0, 2]
    """
    inputs = data.get('inputs')
    if not (isinstance(inputs, (list, tuple)) and len(inputs) > 1
            and all(isinstance(image, torch.Tensor) and image.dim() >= 2 for image in inputs)
            and len({tuple(image.shape) for image in inputs}) > 1):
        return data
    sizes = [tuple(image.shape[-2:]) for image in inputs]
    order: list[int] = []
    height = width = 0
    left = set(range(len(sizes)))
    while left:
        chosen = max(sorted(left), key=lambda k: (
            max(height, sizes[k][0]) * max(width, sizes[k][1]), sizes[k][0] * sizes[k][1]))
        order.append(chosen)
        left.remove(chosen)
        height, width = max(height, sizes[chosen][0]), max(width, sizes[chosen][1])
    return _taken(data, order)


def _taken(value: Any, order: Sequence[int]) -> Any:
    """``value`` with its samples in ``order`` (as :func:`_split` finds them)."""
    if isinstance(value, torch.Tensor) and value.dim():
        return value[list(order)]
    if isinstance(value, (list, tuple)):
        return type(value)(value[k] for k in order)
    if isinstance(value, dict):
        return type(value)((key, _taken(item, order)) for key, item in value.items())
    return value


def merge_log_vars(parts: Sequence[dict], sizes: Sequence[int]) -> dict:
    """The log variables of a batch from those of its micro-batches: each value is the mean
    weighted by micro-batch size (the batch mean for per-sample means, such as losses)."""
    total = sum(sizes)
    return {key: sum(part[key] * size for part, size in zip(parts, sizes)) / total
            for key in parts[0]}
