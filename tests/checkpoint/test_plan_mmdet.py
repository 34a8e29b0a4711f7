"""A plan on an mmdet detector in ``mode='loss'``: dict inputs, data samples, several losses,
FPN branches, and frozen early stages (``frozen_stages=1``)."""
from __future__ import annotations

import copy

import torch
from mmdet.testing import demo_mm_inputs
from mmdet.utils import register_all_modules
from mmengine.config import Config
from mmengine.registry import MODELS

from mmdropit import plan_checkpoints
from mmdropit.checkpoint import build_chain, per_block_plan, record_step
from mmdropit.common.blocks import block_lists
from mmdropit.offload import modules_holding_share
from tests.checkpoint.test_plan import _all_targets
from tests.conftest import ROOT


def _loss_step(model, data):
    def step() -> torch.Tensor:
        return model.parse_losses(model(**data, mode='loss'))[0]
    return step


def _frozen_faster_rcnn() -> tuple[torch.nn.Module, dict]:
    """The tiny Faster R-CNN with its first stage frozen (as every mmdet config), and a batch."""
    register_all_modules()
    cfg = Config.fromfile(ROOT / 'configs' / 'tiny' / 'faster-rcnn_r18_fpn_digits.py')
    cfg.model.backbone.frozen_stages = 1
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.train()
    packed = demo_mm_inputs(batch_size=2, image_shapes=[(3, 160, 224)] * 2, num_items=[3, 2],
                            num_classes=10)
    return model, model.data_preprocessor(packed, True)


def _assert_same_step(model: torch.nn.Module, plain: torch.nn.Module, data: dict) -> None:
    """``model`` (planned) and ``plain`` compute the same loss, gradients and buffers."""
    results = []
    for net in (model, plain):
        torch.manual_seed(1)  # the same proposals sampled in both runs
        loss = _loss_step(net, data)()
        loss.backward()
        results.append((loss.detach(), {n: p.grad for n, p in net.named_parameters()
                                        if p.grad is not None}))
    (loss, grads), (plain_loss, plain_grads) = results
    torch.testing.assert_close(loss, plain_loss)
    assert grads.keys() == plain_grads.keys()
    assert not any(name.startswith('backbone.layer1') for name in grads)  # frozen
    for name in grads:
        torch.testing.assert_close(grads[name], plain_grads[name], rtol=1e-4, atol=1e-5)
    for (name, buffer), plain_buffer in zip(model.named_buffers(), plain.buffers()):
        assert torch.equal(buffer, plain_buffer), name


def test_faster_rcnn_with_frozen_stages_plans_and_keeps_its_gradients():
    model, data = _frozen_faster_rcnn()
    plain = copy.deepcopy(model)

    plan = plan_checkpoints(model, _loss_step(model, data))
    assert plan.targets, str(plan)
    assert not any(t.module.startswith(('backbone.layer1', 'backbone.conv1'))
                   for t in _all_targets(plan))
    assert plan.planned.activation_peak < plan.baseline.activation_peak
    plan.apply(model)
    _assert_same_step(model, plain, data)


def test_per_block_checkpointing_of_a_detector_leaves_its_frozen_stage_out():
    """The simple baseline a budget measures its choice against: mmdet's ``with_cp`` checkpoints
    the backbone's blocks that run with gradients, not the frozen stage's, and so does the
    per-block plan (it used to be no plan at all on a detector with a frozen stage)."""
    model, data = _frozen_faster_rcnn()
    plain = copy.deepcopy(model)
    chain = build_chain(record_step(model, _loss_step(model, data)), model)
    plan = per_block_plan(chain, model)
    assert plan is not None
    stages = {'backbone.layer2': 2, 'backbone.layer3': 2, 'backbone.layer4': 2}  # ResNet-18
    assert [t.module for t in _all_targets(plan)] == [
        f'{stage}.{index}' for stage, blocks in stages.items() for index in range(blocks)]
    assert plan.planned.activation_peak < plan.baseline.activation_peak
    plan.apply(model)
    _assert_same_step(model, plain, data)


def test_per_block_checkpointing_of_a_swin_detector_takes_the_blocks_of_its_module_lists():
    """mmdet's Swin keeps its stages and each stage's blocks in ``ModuleList``s, called in a
    loop: the per-block plan checkpoints every block of every stage (what its ``with_cp``
    does), not the stages, and not the FPN's lateral or output convolutions (lists too, each
    called on a feature map of its own). The planned step keeps the plain one's gradients.
    Activation offload's default choice takes the same blocks, one by one."""
    register_all_modules()
    cfg = Config.fromfile(ROOT / 'configs' / 'tiny' / 'faster-rcnn_r18_fpn_digits.py')
    cfg.model.backbone = dict(type='SwinTransformer', embed_dims=24, depths=(2, 2, 2, 2),
                              num_heads=(1, 1, 2, 2), window_size=7, mlp_ratio=2,
                              out_indices=(0, 1, 2, 3), convert_weights=False, init_cfg=None)
    cfg.model.neck.in_channels = [24, 48, 96, 192]
    torch.manual_seed(0)
    model = MODELS.build(cfg.model)
    model.train()
    packed = demo_mm_inputs(batch_size=2, image_shapes=[(3, 160, 224)] * 2, num_items=[3, 2],
                            num_classes=10)
    data = model.data_preprocessor(packed, True)
    plain = copy.deepcopy(model)
    chain = build_chain(record_step(model, _loss_step(model, data)), model)
    assert chain.blocks == tuple(f'backbone.stages.{stage}.blocks' for stage in range(4))
    assert {'neck.lateral_convs', 'neck.fpn_convs'} <= {name for name, _ in block_lists(model)}
    plan = per_block_plan(chain, model)
    blocks = [f'backbone.stages.{stage}.blocks.{index}' for stage in range(4)
              for index in range(2)]
    assert [t.module for t in _all_targets(plan)] == blocks
    assert plan.planned.activation_peak < plan.baseline.activation_peak
    assert modules_holding_share(model, _loss_step(model, data), None, 1.0) == blocks
    plan.apply(model)
    _assert_same_step(model, plain, data)
