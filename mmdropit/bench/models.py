"""The benchmark's models: random weights, synthetic batches, nothing downloaded.

:data:`MODELS` builds a :class:`~.workload.Workload` by name (timm classifiers at 224x224, mmdet's
Faster R-CNN R50-FPN at a COCO-sized 800x608); :func:`config_workload` builds one from any
MMEngine config and the first batch of its train dataloader. timm, mmdet and mmengine are
imported when a model is built, not before.

Example::

    work = MODELS['deit_tiny']('deit_tiny', batch_size=4, device=torch.device('cpu'))
    work.loss().backward()
"""
from __future__ import annotations

import argparse
import os
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .workload import Workload

IMAGE_SIZE = 224
DET_IMAGE_SIZE = (608, 800)  # (height, width): a COCO-sized image after mmdet's resize


def parse_image_size(text: str) -> tuple[int, int]:
    """``'1333x800'`` (width x height, as a command line gives it) as ``(800, 1333)`` (height,
    width).

    Example:
        >>> parse_image_size('1333x800')
        (800, 1333)

    Raises:
        argparse.ArgumentTypeError: If ``text`` is not WIDTHxHEIGHT with each at least 32
            pixels (the command line's message).
    """
    width, _, height = text.lower().partition('x')
    if not (width.isdigit() and height.isdigit() and int(width) >= 32 and int(height) >= 32):
        raise argparse.ArgumentTypeError(f'{text!r} is not WIDTHxHEIGHT (e.g. 1333x800), '
                                         'each at least 32 pixels')
    return int(height), int(width)
DET_BOXES_PER_IMAGE = 3

Builder = Callable[[str, int, torch.device], Workload]
"""``builder(name, batch_size, device)``: the workload of one model."""


def _timm_builder(arch: str) -> Builder:
    def build(name: str, batch_size: int, device: torch.device) -> Workload:
        import timm
        model = timm.create_model(arch, pretrained=False).to(device).train()
        images = torch.randn(batch_size, 3, IMAGE_SIZE, IMAGE_SIZE, device=device)
        labels = torch.randint(0, model.num_classes, (batch_size,), device=device)

        def part_loss(first: int, size: int) -> torch.Tensor:
            part = slice(first, first + size)
            return F.cross_entropy(model(images[part]), labels[part]) * (size / batch_size)

        return Workload(name, model, lambda: F.cross_entropy(model(images), labels),
                        model.set_grad_checkpointing, batch_size, part_loss)
    return build


def _detector_part_loss(model: nn.Module, data: dict) -> Callable[[int, int], torch.Tensor]:
    """The weighted loss of a slice of a preprocessed detection batch."""
    from ..engine.runner_model import loss_of

    batch_size = len(data['data_samples'])

    def part_loss(first: int, size: int) -> torch.Tensor:
        part = slice(first, first + size)
        return loss_of(model, dict(inputs=data['inputs'][part],
                                   data_samples=data['data_samples'][part])) * (size / batch_size)

    return part_loss


def _synthetic_detection_batch(batch_size: int, image_size: tuple[int, int]) -> dict:
    from mmdet.structures import DetDataSample
    from mmengine.structures import InstanceData

    generator = torch.Generator().manual_seed(0)
    height, width = image_size
    size = min(height, width)
    inputs, samples = [], []
    for _ in range(batch_size):
        inputs.append(torch.randint(0, 256, (3, height, width), dtype=torch.uint8,
                                    generator=generator))
        corner = torch.rand(DET_BOXES_PER_IMAGE, 2, generator=generator) * (size * 3 / 4)
        extent = 32 + torch.rand(DET_BOXES_PER_IMAGE, 2, generator=generator) * (size / 4 - 32)
        sample = DetDataSample(metainfo=dict(img_shape=(height, width),
                                             ori_shape=(height, width), scale_factor=(1.0, 1.0)))
        sample.gt_instances = InstanceData(
            bboxes=torch.cat([corner, corner + extent], dim=1),
            labels=torch.randint(0, 80, (DET_BOXES_PER_IMAGE,), generator=generator))
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


def _build_faster_rcnn(name: str, batch_size: int, device: torch.device,
                       image_size: tuple[int, int] = DET_IMAGE_SIZE) -> Workload:
    """Faster R-CNN R50-FPN on a synthetic batch of ``image_size`` (height, width) images."""
    import mmdet
    from mmdet.registry import MODELS as MMDET_MODELS
    from mmdet.utils import register_all_modules
    from mmengine.config import Config

    from ..engine.runner_model import loss_of

    register_all_modules()
    config = Config.fromfile(os.path.join(os.path.dirname(mmdet.__file__), '.mim', 'configs',
                                          'faster_rcnn', 'faster-rcnn_r50_fpn_1x_coco.py'))
    # Weights stay at PyTorch's default initialisation: init_weights() would load the backbone
    # from torchvision:// (a download) and log every parameter.
    model = MMDET_MODELS.build(config.model).to(device).train()
    data = model.data_preprocessor(_synthetic_detection_batch(batch_size, image_size),
                                   training=True)
    return Workload(name, model, lambda: loss_of(model, data), grad_checkpointing_switch(model),
                    batch_size, _detector_part_loss(model, data))


def grad_checkpointing_switch(model: nn.Module) -> Callable[[bool], None]:
    """The library's own checkpointing switch: timm's ``set_grad_checkpointing`` (also inside
    a wrapper such as ``TimmClassifier``) or ``with_cp`` of mmdet's ResNet blocks."""
    from mmdet.models.backbones.resnet import BasicBlock, Bottleneck

    for module in model.modules():
        if hasattr(module, 'set_grad_checkpointing'):
            return module.set_grad_checkpointing
    blocks = [module for module in model.modules()
              if isinstance(module, (Bottleneck, BasicBlock))]

    def set_with_cp(enable: bool) -> None:
        if not blocks:
            raise NotImplementedError(f'{type(model).__name__} has no checkpointing switch')
        for block in blocks:
            block.with_cp = enable

    return set_with_cp


def config_workload(path: str, device: torch.device) -> Workload:
    """A model built from an MMEngine config, with the first batch of its train dataloader.

    Works for any model the config's registries can build (``TimmClassifier``, mmdet
    detectors, ...); the batch size is the config's.
    """
    import mmdropit  # noqa: F401  (registrations and shims)
    from mmengine.config import Config
    from mmengine.registry import MODELS as ENGINE_MODELS
    from mmengine.registry import DefaultScope
    from mmengine.runner import Runner

    from ..engine.runner_model import loss_of

    cfg = Config.fromfile(path)
    with DefaultScope.overwrite_default_scope(cfg.get('default_scope')):
        model = ENGINE_MODELS.build(cfg.model).to(device).train()
        batch = next(iter(Runner.build_dataloader(cfg.train_dataloader)))
    data = model.data_preprocessor(batch, training=True)
    return Workload(Path(path).stem, model, lambda: loss_of(model, data),
                    grad_checkpointing_switch(model), len(data['data_samples']),
                    _detector_part_loss(model, data))


MODELS: dict[str, Builder] = {
    'deit_tiny': _timm_builder('deit_tiny_patch16_224'),
    'deit_small': _timm_builder('deit_small_patch16_224'),
    'deit_base': _timm_builder('deit_base_patch16_224'),
    'resnet50': _timm_builder('resnet50'),
    'densenet121': _timm_builder('densenet121'),
    'faster_rcnn': _build_faster_rcnn,
}
DETECTION_MODELS = ('faster_rcnn',)
"""Builders that also take ``image_size=(height, width)``."""
