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


def _write_config(tmp_path, body: str) -> str:
    path = tmp_path / 'config.py'
    path.write_text(textwrap.dedent(body))
    return str(path)


def _one_line_error(result) -> str:
    assert result.returncode != 0
    assert 'Traceback' not in result.stderr, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith('error:')]
    assert len(lines) == 1, result.stderr[-3000:]
    return lines[0]


def test_unknown_hook_under_mmdet_scope_is_one_line(tmp_path):
    config = _write_config(tmp_path, f'''
        _base_ = r'{TINY_VIT}'
        default_scope = 'mmdet'
        custom_hooks = [dict(type='DropItHookTypo')]
        ''')
    result = run_tool('tools/train.py', config, '--work-dir', str(tmp_path), check=False)
    line = _one_line_error(result)
    assert "unknown type 'DropItHookTypo'" in line and 'custom_imports' in line


def test_misspelt_model_key_is_one_line(tmp_path):
    config = _write_config(tmp_path, f'''
        _base_ = r'{TINY_VIT}'
        model = dict(label_smoothin=0.1)
        ''')
    result = run_tool('tools/train.py', config, '--work-dir', str(tmp_path), check=False)
    line = _one_line_error(result)
    assert "unexpected keyword argument 'label_smoothin'" in line and 'misspelt' in line


def test_missing_detection_data_is_one_line(tmp_path):
    result = run_tool('tools/train.py', str(TINY_FRCNN), '--work-dir', str(tmp_path),
                      '--cfg-options', *digit_coco_options(tmp_path / 'nowhere'), check=False)
    line = _one_line_error(result)
    assert 'nowhere' in line and 'data_root' in line


BLOCK_MODULE = '''
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == {module!r}:
            raise {error}
sys.meta_path.insert(0, Block())
'''
ABI_BROKEN = "ImportError('mmcv/_ext.so: undefined symbol: _ZN3c1017RegisterOperatorsD1Ev')"


@pytest.mark.parametrize('module,error,expected', [
    ('mmcv._ext', ABI_BROKEN, ('undefined symbol', 'rebuild', 'make env')),
    ('mmcv', "ModuleNotFoundError(\"No module named 'mmcv'\")", ('not installed', 'make env')),
], ids=['abi-broken', 'missing'])
def test_broken_or_missing_mmcv_is_one_line(tmp_path, module, error, expected):
    (tmp_path / 'sitecustomize.py').write_text(BLOCK_MODULE.format(module=module, error=error))
    result = run_tool('tools/train.py', str(TINY_VIT), '--work-dir', str(tmp_path),
                      env={'PYTHONPATH': str(tmp_path)}, check=False)
    line = _one_line_error(result)
    assert all(text in line for text in expected), line


def test_missing_config_file_is_one_line(tmp_path):
    result = run_tool('tools/train.py', str(tmp_path / 'nope.py'), check=False)
    assert 'nope.py' in _one_line_error(result)


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
    cfg = Config(dict(load_from='x.pth'))
    set_resume(cfg, 'auto')
    assert cfg.resume is True and cfg.load_from is None
    checkpoint = tmp_path / 'a.pth'
    torch.save({'meta': {}}, checkpoint)
    set_resume(cfg, str(checkpoint))
    assert cfg.load_from == str(checkpoint)
    with pytest.raises(ConfigError, match='no such checkpoint'):
        set_resume(cfg, str(tmp_path / 'missing.pth'))


def test_test_py_evaluates_the_checkpoint_of_train_py(tmp_path):
    run_tool('tools/train.py', str(TINY_VIT), '--work-dir', str(tmp_path),
             '--cfg-options', *TINY_VIT_2_ITERS)
    result = run_tool('tools/test.py', str(TINY_VIT), str(tmp_path / 'epoch_1.pth'),
                      '--work-dir', str(tmp_path / 'test'), '--cfg-options',
                      'test_dataloader.dataset.indices=100')
    assert re.search(r'Epoch\(test\) \[1/1\]\s+accuracy/top1: \d+\.\d+', result.stdout +
                     result.stderr)


@pytest.mark.parametrize('args', [[], ['configs/tiny/vit-tiny_mnist5k.py'],
                                  ['configs/tiny/vit-tiny_mnist5k.py', 'two']])
def test_dist_train_sh_without_a_process_count_prints_its_usage(args):
    result = subprocess.run(['bash', str(ROOT / 'tools' / 'dist_train.sh'), *args], cwd=ROOT,
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 2
    assert result.stderr.startswith('usage: bash tools/dist_train.sh CONFIG NPROC')
    assert 'unbound variable' not in result.stderr


@pytest.mark.parametrize('broken', ['top', 'base'])
def test_a_config_syntax_error_names_the_file_and_line(tmp_path, broken):
    (tmp_path / 'base.py').write_text("lr = 0.1\nsteps = (1, 2\n" if broken == 'base' else
                                      "lr = 0.1\n")
    top = tmp_path / 'top.py'
    top.write_text("_base_ = ['./base.py']\nx = [1,\n" if broken == 'top' else
                   "_base_ = ['./base.py']\nx = 1\n")
    result = run_tool('tools/train.py', str(top), '--work-dir', str(tmp_path), check=False)
    _one_line_error(result)
    line = 2
    assert f'error: syntax error in config file {tmp_path / (broken + ".py")}, line {line}' \
        in result.stderr, result.stderr


def test_resume_with_a_broken_last_checkpoint_takes_the_newest_whole_one(tmp_path):
    run_tool('tools/train.py', str(TINY_VIT), '--work-dir', str(tmp_path),
             '--cfg-options', *TINY_VIT_2_ITERS)
    (tmp_path / 'last_checkpoint').write_text('')  # killed while MMEngine wrote it
    (tmp_path / 'epoch_2.pth').write_bytes(b'PK\x03\x04 cut short')  # and a half-written one
    result = run_tool('tools/train.py', str(TINY_VIT), '--work-dir', str(tmp_path), '--resume',
                      '--cfg-options', *TINY_VIT_2_ITERS, 'train_cfg.max_epochs=2')
    newest = tmp_path / 'epoch_1.pth'
    assert (f'resume: last_checkpoint is empty; resuming from {newest}, the newest whole '
            'checkpoint in the work dir') in result.stdout
    log = result.stdout + result.stderr
    assert 'Epoch(train) [2][2/2]' in log and 'Epoch(train) [1][' not in log


@pytest.mark.parametrize('how', ['resume', 'test', 'load_from'])
def test_a_truncated_checkpoint_is_one_line_naming_it(tmp_path, how):
    broken = tmp_path / 'epoch_1.pth'
    broken.write_bytes(b'PK\x03\x04 cut short')
    tool, extra = {'resume': ('tools/train.py', ['--resume', str(broken)]),
                   'test': ('tools/test.py', [str(broken)]),
                   'load_from': ('tools/train.py', ['--cfg-options', f'load_from={broken}'])}[how]
    result = run_tool(tool, str(TINY_VIT), *extra, '--work-dir', str(tmp_path / 'work'),
                      check=False)
    _one_line_error(result)
    assert f'checkpoint {broken} is truncated or not a PyTorch checkpoint' in result.stderr


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


@pytest.mark.parametrize('options,message', [
    (['foo'], "--cfg-options takes key=value items (e.g. train_cfg.max_epochs=2), got 'foo'"),
    (['train_cfg.max_epochs=abc'],
     'error: --cfg-options train_cfg.max_epochs=abc: the config holds 8 there; give an integer'),
])
def test_bad_cfg_options_are_one_line(tmp_path, options, message):
    result = run_tool('tools/train.py', str(TINY_VIT), '--work-dir', str(tmp_path),
                      '--cfg-options', *options, check=False)
    assert result.returncode != 0 and 'Traceback' not in result.stderr, result.stderr[-2000:]
    assert message in result.stderr


@pytest.mark.parametrize('tool,args,message', [
    ('tools/train.py', ['missing.py'], "error: config file 'missing.py' does not exist"),
    ('tools/test.py', [str(TINY_VIT), 'missing.pth'], "error: checkpoint 'missing.pth' does not "
                                                       'exist'),
])
def test_a_missing_config_or_checkpoint_gets_no_data_root_hint(tool, args, message):
    result = run_tool(tool, *args, check=False)
    _one_line_error(result)
    assert message in result.stderr and 'data_root' not in result.stderr


def test_test_py_refuses_another_models_checkpoint(tmp_path):
    checkpoint = tmp_path / 'resnet.pth'
    torch.save({'state_dict': {'backbone.conv1.weight': torch.zeros(8, 3, 7, 7)}, 'meta': {}},
               checkpoint)
    result = run_tool('tools/test.py', str(TINY_VIT), str(checkpoint), '--work-dir',
                      str(tmp_path / 'work'), check=False)
    _one_line_error(result)
    assert f'checkpoint {checkpoint} holds 0 of the' in result.stderr
    assert 'it was trained for another model' in result.stderr
