"""Digits on canvas: an offline COCO-format detection and instance-segmentation set.

Real MNIST-5k digits (see :mod:`.mnist5k`) are scaled, coloured and pasted, without
overlapping, onto textured canvases. Every pasted digit becomes one COCO annotation: its class,
the tight box of its strokes and the strokes themselves as an RLE mask. Train images use only
the MNIST-5k ``'train'`` digits and val images only the ``'test'`` digits, so no digit is in both.
mmdet's ``CocoDataset`` and ``CocoMetric`` read the result unchanged.

Generation is deterministic: image ``i`` of a split draws from its own random stream seeded by
``(seed, split, i)``, so the same parameters always give the same JSON and the same PNG bytes.
"""
from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import cv2
import numpy as np
from pycocotools import mask as mask_utils

from ..common.files import atomic_write
from .mnist5k import load_mnist5k

GENERATOR_VERSION = 1
CLASSES = tuple(str(digit) for digit in range(10))
SOURCE_SPLITS = {'train': 'train', 'val': 'test'}
DIGIT_SIZE = 28
# MNIST strokes are anti-aliased; at 128 the digit covers half of the background (alpha 0.5), so
# the mask holds exactly the pixels where the digit's colour dominates what the image shows.
MASK_THRESHOLD = 128
MAX_PLACEMENT_TRIES = 50
_SPLIT_KEYS = {'train': 0, 'val': 1}


def make_digit_coco(out_dir: str | os.PathLike,
                    num_train: int = 1000,
                    num_val: int = 200,
                    canvas_size: Sequence[int] = (256, 256),
                    digits_per_image: Sequence[int] = (1, 4),
                    scale_range: Sequence[float] = (1.0, 2.5),
                    seed: int = 0) -> dict[str, Path]:
    """Write (or reuse) the digits-on-canvas set in COCO format.

    Layout: ``out_dir/annotations/instances_{train,val}.json`` and ``out_dir/{train,val}/*.png``
    (3-channel). Categories are ``'0'``..``'9'`` with COCO ids 1..10. A split whose JSON already
    records the same parameters (in ``info``) and whose images all exist is not written again.

    Args:
        out_dir: Root folder of the set.
        num_train: Number of train images.
        num_val: Number of val images.
        canvas_size: Image ``(height, width)`` in pixels.
        digits_per_image: Inclusive ``(min, max)`` digits tried per image; a digit that finds no
            free place in ``MAX_PLACEMENT_TRIES`` tries is left out.
        scale_range: ``(low, high)`` of the uniform factor applied to the 28x28 digits.
        seed: Non-negative seed of the whole set.

    Returns:
        Paths keyed ``'train_ann'``, ``'train_img'``, ``'val_ann'``, ``'val_img'``.

    Example:
        >>> paths = make_digit_coco('data/digit_coco', num_train=20, num_val=10)
        >>> paths['val_ann'].name
        'instances_val.json'
    """
    height, width = (int(side) for side in canvas_size)
    low_count, high_count = (int(count) for count in digits_per_image)
    low_scale, high_scale = (float(scale) for scale in scale_range)
    if not 1 <= low_count <= high_count:
        raise ValueError(f'digits_per_image must be (min, max) with 1 <= min <= max, '
                         f'got {tuple(digits_per_image)}')
    if not 0 < low_scale <= high_scale:
        raise ValueError(f'scale_range must be (low, high) with 0 < low <= high, '
                         f'got {tuple(scale_range)}')
    if round(DIGIT_SIZE * high_scale) > min(height, width):
        raise ValueError(f'a digit scaled by {high_scale} does not fit a canvas of '
                         f'{height}x{width}: enlarge canvas_size or lower scale_range')
    root = Path(out_dir)
    paths = {}
    for split, num_images in (('train', num_train), ('val', num_val)):
        params = dict(split=split, source_split=SOURCE_SPLITS[split], num_images=int(num_images),
                      canvas_size=[height, width], digits_per_image=[low_count, high_count],
                      scale_range=[low_scale, high_scale], seed=int(seed),
                      generator_version=GENERATOR_VERSION)
        ann_file = root / 'annotations' / f'instances_{split}.json'
        img_dir = root / split
        if not _is_current(ann_file, img_dir, params):
            _write_split(ann_file, img_dir, params)
        paths[f'{split}_ann'] = ann_file
        paths[f'{split}_img'] = img_dir
    return paths


def _is_current(ann_file: Path, img_dir: Path, params: dict) -> bool:
    """Whether ``ann_file`` was written with ``params`` and all its images exist."""
    if not ann_file.is_file():
        return False
    with open(ann_file) as stream:
        coco = json.load(stream)
    info = coco.get('info', {})
    if any(info.get(key) != value for key, value in params.items()):
        return False
    return all((img_dir / image['file_name']).is_file() for image in coco['images'])


def _write_split(ann_file: Path, img_dir: Path, params: dict) -> None:
    """Draw the images of one split, write them as PNG, then write the COCO JSON."""
    digits, labels = load_mnist5k(params['source_split'])
    height, width = params['canvas_size']
    img_dir.mkdir(parents=True, exist_ok=True)
    images, annotations = [], []
    for index in range(params['num_images']):
        rng = np.random.default_rng([params['seed'], _SPLIT_KEYS[params['split']], index])
        canvas, placed = _compose(rng, digits, height, width, params)
        file_name = f'{index:06d}.png'
        if not cv2.imwrite(str(img_dir / file_name), canvas):
            raise OSError(f'could not write {img_dir / file_name}')
        image_id = index + 1
        images.append(dict(id=image_id, file_name=file_name, height=height, width=width))
        for digit_index, x, y, scaled in placed:
            annotations.append(_annotation(len(annotations) + 1, image_id, x, y, scaled,
                                           height, width, int(labels[digit_index]),
                                           params['source_split'], digit_index))
    coco = dict(
        info=dict(description='digits on canvas: real MNIST-5k digits pasted on textured '
                  'canvases (mmdropit)', **params),
        images=images,
        annotations=annotations,
        categories=[dict(id=label + 1, name=name, supercategory='digit')
                    for label, name in enumerate(CLASSES)])
    with atomic_write(ann_file, 'w') as stream:
        json.dump(coco, stream, separators=(',', ':'))


def _compose(rng: np.random.Generator, digits: np.ndarray, height: int, width: int,
             params: dict) -> tuple[np.ndarray, list[tuple[int, int, int, np.ndarray]]]:
    """Paste non-overlapping scaled digits onto a textured background.

    Returns:
        The uint8 ``[H, W, 3]`` image and, per pasted digit, ``(digit index, x, y, scaled
        digit)`` where ``(x, y)`` is the top-left corner of the square scaled patch.
    """
    coarse = rng.uniform(0, 90, size=(8, 8, 3)).astype(np.float32)
    canvas = cv2.resize(coarse, (width, height), interpolation=cv2.INTER_CUBIC)
    low_count, high_count = params['digits_per_image']
    placed, taken = [], []
    for _ in range(int(rng.integers(low_count, high_count + 1))):
        digit_index = int(rng.integers(len(digits)))
        size = int(round(DIGIT_SIZE * rng.uniform(*params['scale_range'])))
        for _ in range(MAX_PLACEMENT_TRIES):
            x = int(rng.integers(width - size + 1))
            y = int(rng.integers(height - size + 1))
            if not any(x < ox + osize and ox < x + size and y < oy + osize and oy < y + size
                       for ox, oy, osize in taken):
                break
        else:
            continue
        scaled = cv2.resize(digits[digit_index], (size, size), interpolation=cv2.INTER_LINEAR)
        if not (scaled >= MASK_THRESHOLD).any():
            continue
        color = rng.integers(160, 256, size=3).astype(np.float32)
        alpha = scaled.astype(np.float32)[..., None] / 255
        patch = canvas[y:y + size, x:x + size]
        canvas[y:y + size, x:x + size] = patch * (1 - alpha) + color * alpha
        taken.append((x, y, size))
        placed.append((digit_index, x, y, scaled))
    return np.clip(np.rint(canvas), 0, 255).astype(np.uint8), placed


def _annotation(ann_id: int, image_id: int, x: int, y: int, scaled: np.ndarray, height: int,
                width: int, label: int, source_split: str, digit_index: int) -> dict:
    """One COCO annotation: tight stroke box, stroke mask as RLE, and where the digit came from."""
    stroke = scaled >= MASK_THRESHOLD
    rows, cols = np.nonzero(stroke)
    mask = np.zeros((height, width), dtype=np.uint8)
    mask[y:y + stroke.shape[0], x:x + stroke.shape[1]] = stroke
    rle = mask_utils.encode(np.asfortranarray(mask))
    return dict(
        id=ann_id,
        image_id=image_id,
        category_id=label + 1,
        bbox=[x + int(cols.min()), y + int(rows.min()),
              int(cols.max() - cols.min()) + 1, int(rows.max() - rows.min()) + 1],
        area=int(stroke.sum()),
        segmentation=dict(size=[height, width], counts=rle['counts'].decode('ascii')),
        iscrowd=0,
        digit=dict(split=source_split, index=digit_index, size=int(stroke.shape[0])))
