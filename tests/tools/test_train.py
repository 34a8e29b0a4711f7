"""tools/train.py: real trainings of the tiny configs, its flags, and its errors."""
from __future__ import annotations

import re
import subprocess
import textwrap

import pytest
import torch
from mmengine.config import Config
from mmengine.optim import AmpOptimWrapper, OptimWrapper
from mmengine.registry import OPTIM_WRAPPERS
from mmengine.runner import Runner

import mmdropit  # noqa: F401
from mmdropit.cli.checkpoint_files import resume_fallback
from mmdropit.cli.train_options import enable_amp, enable_auto_scale_lr, set_resume
from mmdropit.errors import ConfigError
from tests.conftest import (ROOT, TINY_FRCNN, TINY_VIT, TINY_VIT_2_ITERS, digit_coco_options,
                            run_tool)


def test_tiny_vit_trains_two_iterations_in_a_runner(tmp_path):
    cfg = Config.fromfile(TINY_VIT)
    cfg.train_cfg.max_epochs = 1
    cfg.train_dataloader.dataset.indices = 64
    cfg.val_dataloader.dataset.indices = 100
    cfg.work_dir = str(tmp_path)
    runner = Runner.from_cfg(cfg)
    before = runner.model.model.head.weight.detach().clone()
    runner.train()
    assert runner.iter == 2
    assert not torch.equal(before, runner.model.model.head.weight)
    metrics = runner.message_hub.get_scalar('val/accuracy/top1').current()
    assert 0.0 <= metrics <= 100.0
    assert (tmp_path / 'epoch_1.pth').is_file()


def test_faster_rcnn_r18_trains_on_the_digit_set_through_train_py(tmp_path, digit_coco):
    result = run_tool(
        'tools/train.py', str(TINY_FRCNN), '--work-dir', str(tmp_path), '--cfg-options',
        *digit_coco_options(digit_coco), 'train_cfg.max_epochs=1',
        'train_dataloader.dataset.indices=4', 'val_dataloader.dataset.indices=2',
        'default_hooks.logger.interval=1')
    log = result.stdout + result.stderr
    imports = r"custom_imports = dict\(\s*allow_failed_imports=False, imports=\[\s*'mmdropit',"
    assert re.search(imports, log)
    assert 'Epoch(train) [1][2/2]' in log and 'loss_rpn_cls' in log and 'loss_bbox' in log
    assert (tmp_path / 'epoch_1.pth').is_file()


@OPTIM_WRAPPERS.register_module()
class _TestAmpWrapper(AmpOptimWrapper):
    pass


@OPTIM_WRAPPERS.register_module()
class _TestPlainWrapper(OptimWrapper):
    pass


@pytest.fixture
def cuda_present(monkeypatch):
    from mmengine.logging import MMLogger

    MMLogger.get_current_instance()  # created while CUDA is really absent (it asks for a device)
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: True)


def test_amp_turns_the_default_wrapper_into_mixed_precision(cuda_present):
    cfg = Config(dict(optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1))))
    enable_amp(cfg)
    assert cfg.optim_wrapper.type == 'MixedPrecisionOptimWrapper'
    assert cfg.optim_wrapper.loss_scale == 'dynamic'


def test_amp_keeps_micro_batching_settings():
    cfg = Config(dict(optim_wrapper=dict(type='MicroBatchOptimWrapper', micro_batches=4)))
    enable_amp(cfg)
    assert cfg.optim_wrapper.type == 'MixedPrecisionOptimWrapper'
    assert cfg.optim_wrapper.micro_batches == 4


def test_amp_keeps_mmengine_amp_wrapper_on_gpu_and_replaces_it_on_cpu(cuda_present, monkeypatch):
    cfg = Config(dict(optim_wrapper=dict(type='AmpOptimWrapper', dtype='float16')))
    enable_amp(cfg)
    assert cfg.optim_wrapper.type == 'AmpOptimWrapper'
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    enable_amp(cfg)
    assert cfg.optim_wrapper.type == 'MixedPrecisionOptimWrapper'
    assert cfg.optim_wrapper.dtype == 'float16'


def test_amp_keeps_a_custom_amp_wrapper_type(cuda_present):
    cfg = Config(dict(optim_wrapper=dict(type='_TestAmpWrapper', loss_scale=512.0)))
    enable_amp(cfg)
    assert cfg.optim_wrapper.type == '_TestAmpWrapper' and cfg.optim_wrapper.loss_scale == 512.0


def test_amp_refuses_to_replace_a_custom_non_amp_wrapper(cuda_present):
    cfg = Config(dict(optim_wrapper=dict(type='_TestPlainWrapper')))
    with pytest.raises(ConfigError, match='_TestPlainWrapper is not an AmpOptimWrapper'):
        enable_amp(cfg)
    assert cfg.optim_wrapper.type == '_TestPlainWrapper'


def test_amp_without_cuda_refuses_a_gpu_only_amp_subclass(monkeypatch):
    monkeypatch.setattr(torch.cuda, 'is_available', lambda: False)
    cfg = Config(dict(optim_wrapper=dict(type='_TestAmpWrapper')))
    with pytest.raises(ConfigError, match='no CUDA device.*MixedPrecisionOptimWrapper'):
        enable_amp(cfg)


def test_auto_scale_lr_needs_a_base_batch_size():
    with pytest.raises(ConfigError, match='base_batch_size'):
        enable_auto_scale_lr(Config(dict()))
    cfg = Config.fromfile(TINY_FRCNN)
    enable_auto_scale_lr(cfg)
    assert cfg.auto_scale_lr.enable is True


def test_resume_flag_forms(tmp_path):
    cfg = Config(dict(load_from='x.pth', work_dir=str(tmp_path)))
    torch.save({'meta': {}}, tmp_path / 'epoch_1.pth')
    (tmp_path / 'last_checkpoint').write_text(str(tmp_path / 'epoch_1.pth'))
    set_resume(cfg, 'auto')
    assert cfg.resume is True and cfg.load_from is None  # MMEngine reads last_checkpoint
    checkpoint = tmp_path / 'a.pth'
    torch.save({'meta': {}}, checkpoint)
    set_resume(cfg, str(checkpoint))
    assert cfg.load_from == str(checkpoint)
    with pytest.raises(ConfigError, match='no such checkpoint'):
        set_resume(cfg, str(tmp_path / 'missing.pth'))


def test_resume_with_nothing_whole_to_resume_keeps_the_configs_load_from(tmp_path):
    (tmp_path / 'last_checkpoint').write_text('')  # killed while MMEngine wrote it
    cfg = Config(dict(load_from='pretrained.pth', work_dir=str(tmp_path)))
    set_resume(cfg, 'auto')
    assert cfg.resume is False and cfg.load_from == 'pretrained.pth'
    # a first run with --resume (no work dir yet, or an empty one) fine-tunes from load_from
    for work_dir in (tmp_path / 'not_yet', tmp_path / 'empty'):
        cfg = Config(dict(load_from='pretrained.pth', work_dir=str(work_dir)))
        if work_dir.name == 'empty':
            work_dir.mkdir()
        set_resume(cfg, 'auto')
        assert cfg.resume is False and cfg.load_from == 'pretrained.pth'


def test_resume_takes_the_highest_numbered_whole_checkpoint(tmp_path):
    """Not a best checkpoint (no optimizer state) however new; without last_checkpoint too; in
    a work dir moved since, the file last_checkpoint names, found in it."""
    for name in ('epoch_1.pth', 'epoch_3.pth', 'best_accuracy_top1_epoch_2.pth'):
        torch.save({'meta': {}}, tmp_path / name)
    (tmp_path / 'epoch_4.pth').write_bytes(b'PK\x03\x04 cut short')
    assert resume_fallback(str(tmp_path)) == (str(tmp_path / 'epoch_3.pth'),
                                              'no last_checkpoint in the work dir')
    (tmp_path / 'last_checkpoint').write_text('/old/place/epoch_1.pth')
    assert resume_fallback(str(tmp_path)) == (
        str(tmp_path / 'epoch_1.pth'), 'last_checkpoint names /old/place/epoch_1.pth, which is '
        'missing')


def test_test_py_evaluates_the_checkpoint_of_train_py(tmp_path):
    run_tool('tools/train.py', str(TINY_VIT), '--work-dir', str(tmp_path),
             '--cfg-options', *TINY_VIT_2_ITERS)
    result = run_tool('tools/test.py', str(TINY_VIT), str(tmp_path / 'epoch_1.pth'),
                      '--work-dir', str(tmp_path / 'test'), '--cfg-options',
                      'test_dataloader.dataset.indices=100')
    assert re.search(r'Epoch\(test\) \[1/1\]\s+accuracy/top1: \d+\.\d+', result.stdout +
                     result.stderr)


def test_resume_with_a_broken_last_checkpoint_takes_the_newest_whole_one(tmp_path):
    run_tool('tools/train.py', str(TINY_VIT), '--work-dir', str(tmp_path),
             '--cfg-options', *TINY_VIT_2_ITERS)
    (tmp_path / 'last_checkpoint').write_text('')  # killed while MMEngine wrote it
    (tmp_path / 'epoch_2.pth').write_bytes(b'PK\x03\x04 cut short')  # and a half-written one
    result = run_tool('tools/train.py', str(TINY_VIT), '--work-dir', str(tmp_path), '--resume',
                      '--cfg-options', *TINY_VIT_2_ITERS, 'train_cfg.max_epochs=2')
    newest = tmp_path / 'epoch_1.pth'
    assert (f'resume: last_checkpoint is empty; resuming from {newest}, the latest whole '
            'checkpoint in the work dir') in result.stdout
    log = result.stdout + result.stderr
    assert 'Epoch(train) [2][2/2]' in log and 'Epoch(train) [1][' not in log


def test_resume_with_only_a_truncated_checkpoint_starts_afresh_keeping_it(tmp_path):
    truncated = tmp_path / 'epoch_2.pth'
    truncated.write_bytes(b'PK\x03\x04 cut short')
    (tmp_path / 'last_checkpoint').write_text(str(truncated))
    result = run_tool('tools/train.py', str(TINY_VIT), '--work-dir', str(tmp_path), '--resume',
                      '--cfg-options', *TINY_VIT_2_ITERS)
    assert (f'resume: last_checkpoint names {truncated}, which is truncated; no whole checkpoint '
            'in the work dir: training starts afresh, as without --resume') in result.stdout
    log = result.stdout + result.stderr
    assert 'Auto resumed' not in log and 'Traceback' not in log
    assert 'Epoch(train) [1][2/2]' in log
    assert truncated.read_bytes() == b'PK\x03\x04 cut short'


@pytest.mark.slow
def test_amp_trains_the_digits_faster_rcnn_on_cpu(tmp_path, digit_coco):
    """mmcv's nms and roi_align have no bfloat16 kernel: the compat shim runs them in float32."""
    result = run_tool(
        'tools/train.py', str(TINY_FRCNN), '--amp', '--work-dir', str(tmp_path), '--cfg-options',
        *digit_coco_options(digit_coco), 'train_cfg.max_epochs=1',
        'train_dataloader.dataset.indices=4', 'val_dataloader.dataset.indices=2',
        'default_hooks.logger.interval=1')
    log = result.stdout + result.stderr
    assert "type='MixedPrecisionOptimWrapper'" in log
    assert re.search(r'Epoch\(train\) \[1\]\[2/2\].*loss: \d+\.\d+', log)
