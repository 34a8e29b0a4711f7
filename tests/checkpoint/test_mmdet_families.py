"""MMDetection's families train a step under DropIT, under a checkpoint plan (with the
unplanned step's gradients), and split into micro-batches: two-stage, one-stage, DETR,
real-time and instance segmentation detectors, built from mmdet's own configs (random weights,
small synthetic images with boxes and masks).

The detectors are initialised with their own ``init_weights()`` (the backbone from scratch, no
download): building alone leaves some parameters as ``torch.Tensor(n, d)`` made them, i.e.
uninitialised memory (Deformable DETR's and DINO's ``level_embed``), which made their steps
non-finite or different between two runs depending on what the process had allocated before.
Mask2Former runs without its recipe's padding of every batch to 1024 x 1024 (with it, one step
took a minute on the 2-core machine)."""
from __future__ import annotations

import os

import pytest
import torch

from mmdropit import from_dropit, plan_checkpoints, to_dropit

CONFIGS = {
    'faster-rcnn': 'faster_rcnn/faster-rcnn_r50_fpn_1x_coco.py',
    'faster-rcnn-hrnet': 'hrnet/faster-rcnn_hrnetv2p-w18-1x_coco.py',  # multi-branch stages
    'cascade-rcnn': 'cascade_rcnn/cascade-rcnn_r50_fpn_1x_coco.py',
    'retinanet': 'retinanet/retinanet_r50_fpn_1x_coco.py',
    'fcos': 'fcos/fcos_r50-caffe_fpn_gn-head_1x_coco.py',
    'atss': 'atss/atss_r50_fpn_1x_coco.py',
    'detr': 'detr/detr_r50_8xb2-150e_coco.py',
    'deformable-detr': 'deformable_detr/deformable-detr_r50_16xb2-50e_coco.py',
    'dino': 'dino/dino-4scale_r50_8xb2-12e_coco.py',
    'rtmdet': 'rtmdet/rtmdet_tiny_8xb32-300e_coco.py',
    'yolox': 'yolox/yolox_tiny_8xb8-300e_coco.py',
    'mask-rcnn': 'mask_rcnn/mask-rcnn_r50_fpn_1x_coco.py',
    'mask2former': 'mask2former/mask2former_r50_8xb2-lsj-50e_coco.py',
}
SIZE = 160
SIZES = {'dino': 256}  # its 4-scale encoder's top-k queries need more locations than 160 px give
MASKS = {'mask-rcnn', 'mask2former'}
UNPADDED = {'mask2former'}  # its large-scale-jitter recipe pads every batch to 1024 x 1024
BATCH = 2


def _detector(family: str):
    import mmdet
    from mmdet.registry import MODELS
    from mmdet.utils import register_all_modules
    from mmengine.config import Config

    register_all_modules()
    config = Config.fromfile(os.path.join(os.path.dirname(mmdet.__file__), '.mim', 'configs',
                                          CONFIGS[family]))
    config.model.backbone.init_cfg = None  # no download: the backbone starts from scratch
    if family in UNPADDED:
        config.model.data_preprocessor.batch_augments = None
    model = MODELS.build(config.model)
    model.init_weights()
    return model.train()


def _batch(size: int, masks: bool) -> dict:
    from mmdet.structures import DetDataSample
    from mmdet.structures.mask import BitmapMasks
    from mmengine.structures import InstanceData

    generator = torch.Generator().manual_seed(0)
    inputs, samples = [], []
    for _ in range(BATCH):
        inputs.append(torch.randint(0, 256, (3, size, size), dtype=torch.uint8,
                                    generator=generator))
        corner = torch.randint(0, size // 2, (2, 2), generator=generator).float()
        boxes = torch.cat([corner, corner + size // 3], dim=1)
        sample = DetDataSample(metainfo=dict(img_shape=(size, size), ori_shape=(size, size),
                                             scale_factor=(1.0, 1.0)))
        instances = InstanceData(bboxes=boxes, labels=torch.tensor([1, 7]))
        if masks:
            bitmap = torch.zeros(2, size, size, dtype=torch.uint8)
            for index, (x0, y0, x1, y1) in enumerate(boxes.int().tolist()):
                bitmap[index, y0:y1, x0:x1] = 1
            instances.masks = BitmapMasks(bitmap.numpy(), size, size)
        sample.gt_instances = instances
        samples.append(sample)
    return dict(inputs=inputs, data_samples=samples)


def _loss(model, data: dict, part: slice = slice(None)) -> torch.Tensor:
    losses = model(data['inputs'][part], data['data_samples'][part], mode='loss')
    return model.parse_losses(losses)[0]


def _step_grads(model, data: dict) -> dict[str, torch.Tensor]:
    torch.manual_seed(0)
    model.zero_grad(set_to_none=True)
    loss = _loss(model, data)
    assert torch.isfinite(loss), loss
    loss.backward()
    return {name: param.grad.clone() for name, param in model.named_parameters()
            if param.grad is not None}


@pytest.mark.slow
@pytest.mark.parametrize('family', list(CONFIGS))
def test_family_trains_under_dropit_a_checkpoint_plan_and_micro_batches(family):
    from mmengine.logging import MessageHub

    MessageHub.get_current_instance().update_info('iter', 0)  # YOLOX's batch resizing reads it
    torch.manual_seed(0)
    model = _detector(family)
    data = model.data_preprocessor(_batch(SIZES.get(family, SIZE), masks=family in MASKS),
                                   training=True)
    exact = _step_grads(model, data)

    to_dropit(model, gamma=0.9)
    dropit = _step_grads(model, data)
    assert set(dropit) == set(exact)
    from_dropit(model)

    torch.manual_seed(0)
    plan = plan_checkpoints(model, lambda: _loss(model, data))  # the least memory
    plan.apply(model)
    try:
        planned = _step_grads(model, data)
    finally:
        plan.remove(model)
    assert plan.targets, f'{family}: nothing could be checkpointed\n{plan}'
    assert set(planned) == set(exact)
    for name, grad in exact.items():  # exact: the unplanned step's gradients
        torch.testing.assert_close(planned[name], grad, rtol=1e-4, atol=1e-5, msg=name)

    model.zero_grad(set_to_none=True)
    for first in range(BATCH):  # one image per micro-batch, losses weighted by their share
        (_loss(model, data, slice(first, first + 1)) / BATCH).backward()
    assert all(torch.isfinite(param.grad).all() for param in model.parameters()
               if param.grad is not None)
