"""The CUDA paths, run on a GPU machine (``pytest -m cuda``; skipped without CUDA): DropIT's
kernels on the GPU, the CUDA memory meters, fp16 with loss scaling through ``tools/train.py``
(the tiny ViT with DropIT and a plan, the digits Faster R-CNN with mmcv's CUDA ops), and the
memory snapshot script. ``bash tools/gpu/on_device.sh OUT setup mmcv tests`` runs them there."""
from __future__ import annotations

import copy
import re

import pytest
import torch
from torch import nn

from mmdropit.dropit import to_dropit
from mmdropit.memory import StepPeakMeter
from tests.conftest import ROOT, TINY_VIT_2_ITERS, digit_coco_options, run_tool
from tests.helpers.keyword_loop import KeywordLoop

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')]

FP16 = ['optim_wrapper.type=MixedPrecisionOptimWrapper', 'optim_wrapper.dtype=float16']


def _grads(model: nn.Module, inputs: torch.Tensor) -> list[torch.Tensor]:
    inputs = inputs.clone().requires_grad_(True)
    model(inputs).square().mean().backward()
    return [inputs.grad, *(param.grad for param in model.parameters())]


@pytest.mark.parametrize('layer,shape', [(nn.Linear(64, 128), (32, 64)),
                                         (nn.Conv2d(8, 16, 3, padding=1), (4, 8, 16, 16))])
def test_dropit_gradients_on_the_gpu_equal_the_cpus(layer, shape):
    torch.manual_seed(0)
    on_cpu = to_dropit(nn.Sequential(layer), gamma=0.9, exclude=[])
    on_gpu = copy.deepcopy(on_cpu).cuda()
    inputs = torch.randn(shape)
    for cpu, gpu in zip(_grads(on_cpu, inputs), _grads(on_gpu, inputs.cuda())):
        torch.testing.assert_close(gpu.cpu(), cpu, rtol=1e-4, atol=1e-5)


def test_the_step_peak_meter_reads_the_cuda_allocator():
    model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024)).cuda()
    optimizer = torch.optim.AdamW(model.parameters())
    with StepPeakMeter(model, optimizer, torch.device('cuda'), reset_peak=True) as meter:
        model(torch.randn(512, 1024, device='cuda')).sum().backward()
        optimizer.step()
    peak = meter.result
    parameters = sum(p.numel() * p.element_size() for p in model.parameters())
    assert peak.peak_bytes > 3 * parameters  # parameters, gradients, two AdamW moments
    assert peak.reserved_bytes >= peak.peak_bytes


def test_the_reserved_peak_is_the_steps_own_not_an_earlier_steps_cache():
    model = nn.Linear(1024, 1024).cuda()
    torch.empty(2**30, dtype=torch.uint8, device='cuda')  # freed at once: 1 GiB left cached
    with StepPeakMeter(model, device=torch.device('cuda'), reset_peak=True) as meter:
        model(torch.randn(64, 1024, device='cuda')).sum().backward()
    assert meter.result.reserved_bytes < 2**30


def _losses_and_scales(log: str) -> tuple[list[float], list[float]]:
    lines = re.findall(r'Epoch\(train\).*', log)
    losses = [float(v) for line in lines for v in re.findall(r'\bloss: ([0-9.e+-]+)', line)]
    scales = [float(v) for line in lines for v in re.findall(r'loss_scale: ([0-9.e+-]+)', line)]
    return losses, scales


def test_fp16_with_loss_scaling_trains_the_tiny_vit_with_dropit_and_a_plan(tmp_path):
    config = ROOT / 'configs' / 'tiny' / 'vit-tiny_dropit-mink0.9_ckpt-plan_mnist5k.py'
    result = run_tool('tools/train.py', str(config), '--work-dir', str(tmp_path),
                      '--cfg-options', *TINY_VIT_2_ITERS, *FP16)
    losses, scales = _losses_and_scales(result.stdout + result.stderr)
    assert len(losses) == 2 and all(loss == loss for loss in losses)
    assert len(scales) == 2 and all(scale > 0 for scale in scales)


def test_fp16_with_loss_scaling_trains_the_digits_faster_rcnn(tmp_path, digit_coco):
    pytest.importorskip('mmcv._ext', reason="needs mmcv's CUDA ops (nms, RoIAlign)")
    base = ROOT / 'configs' / 'tiny' / 'faster-rcnn_r18_fpn_dropit-mink0.9_digits.py'
    config = tmp_path / 'config.py'
    config.write_text(
        f"_base_ = r'{base}'\n"
        "custom_hooks = [dict(type='DropITHook', gamma=0.9),\n"
        "                dict(type='CheckpointPlanHook', budget=None)]\n")
    result = run_tool('tools/train.py', str(config), '--work-dir', str(tmp_path / 'work'),
                      '--cfg-options', *digit_coco_options(digit_coco), *FP16,
                      'train_cfg.max_epochs=1', 'train_dataloader.dataset.indices=4',
                      'val_dataloader.dataset.indices=2', 'default_hooks.logger.interval=1')
    losses, scales = _losses_and_scales(result.stdout + result.stderr)
    assert len(losses) == 2 and all(loss == loss for loss in losses)
    assert scales and all(scale > 0 for scale in scales)


def test_the_memory_snapshot_script_writes_a_timeline(tmp_path):
    run_tool('tools/gpu/memory_snapshot.py', '--model', 'deit_tiny', '--batch-size', '2',
             '--variants', 'baseline,ckpt-plan-min', '--out', str(tmp_path))
    for variant in ('baseline', 'ckpt-plan-min'):
        assert (tmp_path / f'snapshot_deit_tiny_{variant}.html').stat().st_size > 1000
    assert (tmp_path / 'snapshot_deit_tiny.png').stat().st_size > 1000


def test_quantized_activations_are_offered_on_a_gpu_when_their_codecs_have_kernels():
    from mmdropit.kernels.switch import eager_only
    from mmdropit.planner import quantize_unavailable

    model = nn.Linear(2, 2).cuda()
    assert quantize_unavailable(model) is None  # Triton ships with the CUDA build of torch
    with eager_only():
        assert "without their codecs' Triton kernels" in quantize_unavailable(model)
    assert quantize_unavailable(nn.Linear(2, 2)) is None


def test_the_plan_hook_keeps_the_checkpoints_inputs_in_host_memory(tmp_path):
    """``CheckpointPlanHook(inputs_on_host=True)`` on a GPU: the least-memory plan is searched
    with the inputs on the host (single-level), written so, and trains with them there."""
    from mmengine.runner import Runner

    from mmdropit.checkpoint import CheckpointPlan
    from mmdropit.engine.hooks import CheckpointPlanHook
    from tests.conftest import TINY_VIT, log_text, two_iteration_cfg

    cfg = two_iteration_cfg(TINY_VIT, tmp_path,
                            dict(type='CheckpointPlanHook', budget=None, inputs_on_host=True))
    runner = Runner.from_cfg(cfg)
    runner.train()
    plan = CheckpointPlan.load(tmp_path / 'checkpoint_plan_32x1x128x128.json')
    assert plan.inputs_on_host and plan.planned.host_bytes > 0
    assert not any(target.inner for target in plan.targets)
    hook = next(h for h in runner.hooks if isinstance(h, CheckpointPlanHook))
    assert hook._applied.host.stats.tensors_moved > 0
    assert 'in host memory for the least memory' in log_text(tmp_path)


class _KeywordDropout(nn.Module):
    """A block taking its input by keyword, with dropout (as a DETR layer's ``query=``)."""

    def __init__(self) -> None:
        super().__init__()
        self.linear, self.dropout = nn.Linear(256, 256), nn.Dropout(0.5)

    def forward(self, *, query: torch.Tensor) -> torch.Tensor:
        return self.dropout(self.linear(query)).relu()


def test_a_checkpoint_taking_its_gpu_input_by_keyword_drops_the_same_elements_again():
    """torch's checkpoint restores the random state only of its positional tensors' devices:
    a checkpointed block given its GPU input by keyword would recompute other dropout masks.
    The planned step's gradients are the plain step's."""
    from mmdropit.checkpoint import CheckpointPlan, ModuleTarget

    torch.manual_seed(0)
    net = KeywordLoop((_KeywordDropout() for _ in range(3)), 'query').cuda()
    x = torch.randn(64, 256, device='cuda')
    results = []
    for plan in (None, CheckpointPlan([ModuleTarget('blocks.0'), ModuleTarget('blocks.1')])):
        net.zero_grad(set_to_none=True)
        torch.cuda.manual_seed(1)
        if plan is None:
            net(x).square().mean().backward()
        else:
            with plan.apply(net):
                net(x).square().mean().backward()
        results.append([param.grad.clone() for param in net.parameters()])
    for planned, plain in zip(*results[::-1]):
        torch.testing.assert_close(planned, plain)
