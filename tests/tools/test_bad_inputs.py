"""Bad inputs a new user gives ``tools/train.py``, ``tools/test.py``, ``tools/dist_train.sh``
and our hooks and wrappers: each ends in one ``error: ...`` line that says what to do, with
no traceback."""
from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import torch
from torch._utils import ExceptionWrapper

from mmdropit.cli.friendly_errors import explain
from mmdropit.cli.run import run_reporting_errors
from mmdropit.errors import DataFormatError
from tests.conftest import (ROOT, TINY_FRCNN, TINY_VIT, TINY_VIT_2_ITERS, digit_coco_options,
                            free_port, one_line_error, run_dist_train, run_tool)


def _write_config(tmp_path, body: str) -> str:
    path = tmp_path / 'config.py'
    path.write_text(textwrap.dedent(body))
    return str(path)


def test_unknown_hook_under_mmdet_scope_is_one_line(tmp_path):
    config = _write_config(tmp_path, f'''
        _base_ = r'{TINY_VIT}'
        default_scope = 'mmdet'
        custom_hooks = [dict(type='DropItHookTypo')]
        ''')
    result = run_tool('tools/train.py', config, '--work-dir', str(tmp_path), check=False)
    line = one_line_error(result)
    assert "unknown type 'DropItHookTypo'" in line and 'custom_imports' in line


def test_misspelt_model_key_is_one_line(tmp_path):
    config = _write_config(tmp_path, f'''
        _base_ = r'{TINY_VIT}'
        model = dict(label_smoothin=0.1)
        ''')
    result = run_tool('tools/train.py', config, '--work-dir', str(tmp_path), check=False)
    line = one_line_error(result)
    assert "unexpected keyword argument 'label_smoothin'" in line and 'misspelt' in line


def test_missing_detection_data_is_one_line(tmp_path):
    result = run_tool('tools/train.py', str(TINY_FRCNN), '--work-dir', str(tmp_path),
                      '--cfg-options', *digit_coco_options(tmp_path / 'nowhere'), check=False)
    line = one_line_error(result)
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
    result = run_tool('tools/train.py', str(TINY_FRCNN), '--work-dir', str(tmp_path),
                      env={'PYTHONPATH': str(tmp_path)}, check=False)
    line = one_line_error(result)
    assert all(text in line for text in expected), line


@pytest.mark.parametrize('config,trains', [(TINY_VIT, True), (TINY_FRCNN, False)],
                         ids=['timm', 'mmdet'])
def test_mmcv_installed_without_its_ops_trains_all_but_mmdet_models(tmp_path, config, trains):
    import mmcv

    # this mmcv as MMCV_WITH_OPS=0 installs it: the same package without the compiled ops
    shutil.copytree(Path(mmcv.__file__).parent, tmp_path / 'mmcv',
                    ignore=shutil.ignore_patterns('_ext*', '__pycache__'))
    result = run_tool('tools/train.py', str(config), '--work-dir', str(tmp_path / 'work'),
                      '--cfg-options', *TINY_VIT_2_ITERS, env={'PYTHONPATH': str(tmp_path)},
                      check=trains)
    if trains:
        assert 'Saving checkpoint at 1 epochs' in result.stdout + result.stderr
    else:
        line = one_line_error(result)
        assert "compiled ops do not load" in line and "No module named 'mmcv._ext'" in line


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
    one_line_error(result)
    line = 2
    assert f'error: syntax error in config file {tmp_path / (broken + ".py")}, line {line}' \
        in result.stderr, result.stderr



@pytest.mark.parametrize('how', ['resume', 'test', 'load_from'])
def test_a_truncated_checkpoint_is_one_line_naming_it(tmp_path, how):
    broken = tmp_path / 'epoch_1.pth'
    broken.write_bytes(b'PK\x03\x04 cut short')
    tool, extra = {'resume': ('tools/train.py', ['--resume', str(broken)]),
                   'test': ('tools/test.py', [str(broken)]),
                   'load_from': ('tools/train.py', ['--cfg-options', f'load_from={broken}'])}[how]
    result = run_tool(tool, str(TINY_VIT), *extra, '--work-dir', str(tmp_path / 'work'),
                      check=False)
    one_line_error(result)
    assert f'checkpoint {broken} is truncated or not a PyTorch checkpoint' in result.stderr



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
    one_line_error(result)
    assert message in result.stderr and 'data_root' not in result.stderr


def test_test_py_refuses_another_models_checkpoint(tmp_path):
    checkpoint = tmp_path / 'resnet.pth'
    torch.save({'state_dict': {'backbone.conv1.weight': torch.zeros(8, 3, 7, 7)}, 'meta': {}},
               checkpoint)
    result = run_tool('tools/test.py', str(TINY_VIT), str(checkpoint), '--work-dir',
                      str(tmp_path / 'work'), check=False)
    one_line_error(result)
    assert f'checkpoint {checkpoint} holds 0 of the' in result.stderr
    assert 'it was trained for another model' in result.stderr


def test_test_py_refuses_a_checkpoint_of_another_width(tmp_path):
    from mmengine.config import Config
    from mmengine.registry import MODELS

    model = Config.fromfile(TINY_VIT).model
    model.embed_dim = 48  # the config's is 96
    checkpoint = tmp_path / 'narrow.pth'
    torch.save({'state_dict': MODELS.build(model).state_dict(), 'meta': {}}, checkpoint)
    result = run_tool('tools/test.py', str(TINY_VIT), str(checkpoint), '--work-dir',
                      str(tmp_path / 'work'), check=False)
    assert (f'error: checkpoint {checkpoint}: 55 of its weights have other shapes than this '
            "config's model's (e.g. model.cls_token: (1, 1, 48) in the checkpoint, (1, 1, 96) "
            'in the model): it was trained with other model settings (e.g. another width)') \
        in one_line_error(result)


@dataclass(frozen=True)
class BadInput:
    """One bad input: ``config`` (lines added to the tiny ViT's, written to
    ``{tmp}/config.py``) or ``args`` naming ``{config}``; ``expected`` is in the error line."""

    args: list[str]
    expected: str
    config: str = ''
    tool: str = 'tools/train.py'
    options: list[str] = field(default_factory=list)


def _hooks(*hooks: str) -> str:
    return f'custom_hooks = [{", ".join(hooks)}]'


STEPS = ['--cfg-options', *TINY_VIT_2_ITERS]  # for inputs found only in the first iteration
BAD_INPUTS = {
    'launcher-outside-torchrun': BadInput(
        ['{config}', '--launcher', 'pytorch'], 'run bash tools/dist_train.sh CONFIG NPROC'),
    'config-not-a-config': BadInput(['{tmp}/notes.txt'], 'is not a .py, .json or .yaml file'),
    'work-dir-is-a-file': BadInput(['{config}', '--work-dir', '{tmp}/notes.txt'],
                                   'notes.txt is a file: give a directory'),
    'resume-missing-file': BadInput(['{config}', '--resume', '{tmp}/gone.pth'],
                                    'gone.pth: no such checkpoint file'),
    'load-from-a-text-file': BadInput(['{config}'], 'truncated or not a PyTorch checkpoint',
                                      config="load_from = r'{tmp}/notes.txt'"),
    'dropit-gamma-above-1': BadInput(['{config}'], 'gamma must be a number in [0, 1)',
                                     config=_hooks("dict(type='DropITHook', gamma=1.5)")),
    'dropit-unknown-strategy': BadInput(
        ['{config}'], "unknown DropIT strategy 'topk': use one of",
        config=_hooks("dict(type='DropITHook', strategy='topk')")),
    'dropit-misspelt-key': BadInput(['{config}'], "unexpected keyword argument 'gama'",
                                    config=_hooks("dict(type='DropITHook', gama=0.9)")),
    'dropit-negative-warmup': BadInput(
        ['{config}'], 'warmup_iters must be an int >= 0',
        config=_hooks("dict(type='DropITHook', warmup_iters=-1)")),
    'dropit-warmup-compiled': BadInput(
        ['{config}'], 'warmup_iters changes gamma every iteration',
        config=_hooks("dict(type='DropITHook', warmup_iters=10)") + '\ncompile = True'),
    'dropit-layers-as-text': BadInput(['{config}'], 'take a list of name patterns',
                                      config=_hooks("dict(type='DropITHook', layers='head')")),
    'dropit-layers-match-nothing': BadInput(
        ['{config}', *STEPS], 'DropIT converted no layer of TimmClassifier',
        config=_hooks("dict(type='DropITHook', layers=['no.such.layer'])")),
    'plan-budget-unit': BadInput(['{config}'], "such as '4GB' or '512MiB'; got '11XB'",
                                 config=_hooks("dict(type='CheckpointPlanHook', budget='11XB')")),
    'plan-budget-negative': BadInput(
        ['{config}'], 'a fraction must lie in (0, 1], got -0.5',
        config=_hooks("dict(type='CheckpointPlanHook', budget=-0.5)")),
    'plan-granularity-zero': BadInput(
        ['{config}'], 'granularity must be an int >= 1',
        config=_hooks("dict(type='CheckpointPlanHook', granularity=0)")),
    'budget-hook-without-budget': BadInput(['{config}'], "missing 1 required positional argument",
                                           config=_hooks("dict(type='MemoryBudgetHook')")),
    'budget-hook-unknown-technique': BadInput(
        ['{config}'], "allow takes a list of lossy techniques",
        config=_hooks("dict(type='MemoryBudgetHook', budget=0.5, allow=['teleport'])")),
    'budget-hook-with-a-plan-hook': BadInput(
        ['{config}'], 'remove CheckpointPlanHook from custom_hooks',
        config=_hooks("dict(type='MemoryBudgetHook', budget=0.5)",
                      "dict(type='CheckpointPlanHook')")),
    'report-hook-interval-zero': BadInput(
        ['{config}'], 'MemoryReportHook interval must be an int >= 1',
        config=_hooks("dict(type='MemoryReportHook', interval=0)")),
    'micro-batches-zero': BadInput(
        ['{config}'], 'micro_batches must be a positive integer, got 0',
        config="optim_wrapper = dict(type='MicroBatchOptimWrapper', micro_batches=0)"),
    'micro-batches-and-a-budget': BadInput(
        ['{config}'], 'give either micro_batches or memory_budget, not both',
        config="optim_wrapper = dict(type='MicroBatchOptimWrapper', micro_batches=2, "
               "memory_budget='1GB')"),
    'more-micro-batches-than-samples': BadInput(
        ['{config}', *STEPS], 'cannot split a batch of 32 samples into 1000 micro-batches',
        config="optim_wrapper = dict(type='MicroBatchOptimWrapper', micro_batches=1000)"),
    'mixed-precision-dtype': BadInput(
        ['{config}'], "dtype must be 'float16' or 'bfloat16', got 'float8'",
        config="optim_wrapper = dict(type='MixedPrecisionOptimWrapper', dtype='float8')"),
    'amp-optim-wrapper-on-a-cpu': BadInput(
        ['{config}'], "AmpOptimWrapper needs a GPU: on a CPU use",
        config="optim_wrapper = dict(type='AmpOptimWrapper', dtype='bfloat16')"),
    'memory-budget-of-no-bytes': BadInput(
        ['{config}'], 'a size must be above zero bytes',
        config=_hooks("dict(type='MemoryBudgetHook', budget='0GB')")),
    'unknown-model-type': BadInput(['{config}'], "unknown type 'NoSuchModel'",
                                   config="model = dict(_delete_=True, type='NoSuchModel')"),
    'unknown-optimizer-type': BadInput(
        ['{config}'], "unknown optimizer type 'Adamm'",
        config="optim_wrapper = dict(optimizer=dict(_delete_=True, type='Adamm', lr=1e-3))"),
    'unknown-scheduler-type': BadInput(
        ['{config}', *STEPS], "unknown type 'NoSched' in the config (mmengine::parameter "
        'scheduler registry)', config="param_scheduler = [dict(type='NoSched')]"),
    'unknown-timm-model': BadInput(['{config}'], "timm has no model 'vit_nonexistent'",
                                   config="model = dict(model_name='vit_nonexistent')"),
    'custom-import-missing': BadInput(
        ['{config}'], "no module named 'no_such_module'",
        config="custom_imports = dict(imports=['mmdropit', 'no_such_module'])"),
    'batch-size-zero': BadInput(['{config}', '--cfg-options', 'train_dataloader.batch_size=0'],
                                'set train_dataloader.batch_size'),
    'val-interval-zero': BadInput(['{config}', '--cfg-options', 'train_cfg.val_interval=0'],
                                  'train_cfg.val_interval must be an int >= 1'),
    'learning-rate-as-text': BadInput(
        ['{config}', '--cfg-options', 'optim_wrapper.optimizer.lr=fast'],
        'the config holds 0.001 there; give a number'),
    'data-root-the-datasets-ignore': BadInput(
        [str(TINY_FRCNN), '--cfg-options', 'data_root={tmp}/coco/'],
        'set train_dataloader.dataset.data_root={tmp}/coco/'),
    'sharding-without-torchrun': BadInput(
        ['{config}'], 'launch with `bash tools/dist_train.sh CONFIG 2`',
        config="model_wrapper_cfg = dict(type='FullyShardModelWrapper')"),
    'test-checkpoint-is-a-directory': BadInput(['{config}', '{tmp}'], 'is a directory',
                                               tool='tools/test.py'),
    'test-checkpoint-is-text': BadInput(['{config}', '{tmp}/notes.txt'],
                                        'truncated or not a PyTorch checkpoint',
                                        tool='tools/test.py'),
}


@pytest.mark.parametrize('bad', BAD_INPUTS.values(), ids=BAD_INPUTS.keys())
def test_a_bad_input_is_one_line(tmp_path, bad):
    (tmp_path / 'notes.txt').write_text('not a config, not a checkpoint')
    config = tmp_path / 'config.py'
    config.write_text(f"_base_ = r'{TINY_VIT}'\n{bad.config.format(tmp=tmp_path)}\n")
    args = [arg.format(config=config, tmp=tmp_path) for arg in bad.args]
    if '--work-dir' not in args:
        args += ['--work-dir', str(tmp_path / 'work')]
    result = run_tool(bad.tool, *args, check=False)
    assert bad.expected.format(tmp=tmp_path) in one_line_error(result)


def test_dist_train_sh_with_a_missing_config_is_one_line(tmp_path):
    result = subprocess.run(['bash', str(ROOT / 'tools' / 'dist_train.sh'),
                             str(tmp_path / 'nope.py'), '2'], cwd=ROOT, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 1
    assert result.stderr == f"error: config file '{tmp_path / 'nope.py'}' does not exist\n"


def _dist_train_sh(*args: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(['bash', str(ROOT / 'tools' / 'dist_train.sh'), *args], cwd=ROOT,
                          env=dict(os.environ, **env), capture_output=True, text=True,
                          timeout=120)


def test_dist_train_sh_with_its_port_in_use_is_one_line():
    with socket.socket() as taken:  # as another run's rendezvous holds it
        taken.bind(('127.0.0.1', 0))
        taken.listen()
        port = taken.getsockname()[1]
        path = f'{Path(sys.executable).parent}{os.pathsep}{os.environ["PATH"]}'
        result = _dist_train_sh(str(TINY_VIT), '2', env={'PORT': str(port), 'PATH': path})
    assert result.returncode == 1
    assert result.stderr.startswith(f'error: port {port} is in use (another distributed run?): '
                                    'choose a free one, e.g. PORT='), result.stderr
    assert f'bash tools/dist_train.sh {TINY_VIT} 2 ...' in result.stderr
    assert result.stderr.count('\n') == 1, result.stderr


@pytest.mark.parametrize('port', ['abc', '0', '70000'])
def test_dist_train_sh_with_a_port_that_is_no_port_is_one_line(port):
    result = _dist_train_sh(str(TINY_VIT), '2', env={'PORT': port})
    assert result.returncode == 1
    assert result.stderr == f"error: PORT must be a number from 1 to 65535, got '{port}'\n"


def _path_without_torchrun() -> str:
    return os.pathsep.join(folder for folder in os.environ['PATH'].split(os.pathsep)
                           if not os.access(Path(folder) / 'torchrun', os.X_OK))


def test_dist_train_sh_without_torchrun_on_path_says_what_to_activate():
    result = _dist_train_sh(str(TINY_VIT), '2', env={'PATH': _path_without_torchrun()})
    venv = ROOT / '.venv'
    advice = (f'activate the environment first (source {venv}/bin/activate) or set '
              f'PYTHON={venv}/bin/python' if (venv / 'bin' / 'torchrun').exists() else
              'activate the Python environment that has torch')
    assert result.returncode == 127
    assert result.stderr.startswith(f'error: torchrun is not on PATH: {advice}'), result.stderr
    assert result.stderr.count('\n') == 1, result.stderr


def test_dist_train_sh_runs_the_python_it_is_given(tmp_path):
    result = _dist_train_sh(str(TINY_VIT), '1', '--work-dir', str(tmp_path), '--cfg-options',
                            *TINY_VIT_2_ITERS,
                            env={'PATH': _path_without_torchrun(), 'PYTHON': sys.executable,
                                 'PORT': str(free_port()), 'OMP_NUM_THREADS': '1'})
    assert result.returncode == 0, result.stderr[-3000:]
    assert 'Saving checkpoint at 1 epochs' in result.stdout + result.stderr


def test_a_rank_that_hangs_is_one_line_on_the_others(tmp_path):
    """Rank 1 sleeps before training; rank 0's first gradient all-reduce gives up after
    ``env_cfg.dist_cfg.timeout`` seconds and says so."""
    config = tmp_path / 'config.py'
    config.write_text(
        f"_base_ = r'{TINY_VIT}'\n"
        "custom_imports = dict(imports=['mmdropit', 'tests.helpers.sleep_hook'])\n"
        "custom_hooks = [dict(type='SleepHook', rank=1, seconds=60)]\n"
        "env_cfg = dict(dist_cfg=dict(backend='gloo', timeout=3))\n")
    result = run_dist_train(str(config), 2, '--work-dir', str(tmp_path / 'work'),
                            '--cfg-options', *TINY_VIT_2_ITERS, check=False)
    assert result.returncode != 0
    assert 'error: this rank waited 3 s for another rank in a collective' in result.stderr
    assert 'raise env_cfg.dist_cfg.timeout (seconds)' in result.stderr


@pytest.mark.parametrize('peer', ['closed by peer', 'Connection reset by peer'])
def test_a_rank_whose_peer_died_is_one_line_saying_how_to_go_on(peer):
    """gloo's words when another rank was killed (its TCP pair read fails either way)."""
    error = RuntimeError('[../third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error '
                         f'[127.0.0.1]:29851: {peer}')
    assert explain(error) == ('another rank of this run ended early (torchrun names it and its '
                              'exit code in its summary, its log has the cause): once fixed, '
                              'continue with the same command and --resume')


def test_a_missing_base_file_is_one_line_naming_it(tmp_path):
    config = tmp_path / 'child.py'
    config.write_text("_base_ = ['./nowhere/base.py']\ntrain_cfg = dict(max_epochs=1)\n")
    result = run_tool('tools/train.py', str(config), '--work-dir', str(tmp_path / 'work'),
                      check=False)
    assert (f'names a file that does not exist: {tmp_path}/nowhere/base.py -- a _base_ path is '
            'relative to the config that names it') in one_line_error(result)


@pytest.mark.parametrize('raised, expected', [
    (DataFormatError('cifar.pkl is not a plain data pickle: it calls os.system'),
     'cifar.pkl is not a plain data pickle: it calls os.system'),
    (FileNotFoundError("[Errno 2] No such file or directory: 'data/img_7.png'"),
     "[Errno 2] No such file or directory: 'data/img_7.png' -- check data_root"),
])
def test_an_error_in_a_dataloader_worker_is_explained_by_its_own_message(raised, expected):
    """torch raises a worker's error again as ``Caught X in DataLoader worker process N.``
    with the worker's traceback; the line says what the worker's error said."""
    try:
        raise raised
    except Exception:
        wrapped = ExceptionWrapper(where='in DataLoader worker process 0')
    with pytest.raises(type(raised)) as error:
        wrapped.reraise()
    assert str(error.value).startswith('Caught ')
    assert explain(error.value).startswith(expected)


def test_ctrl_c_is_one_line_saying_how_to_go_on(capsys):
    def interrupted() -> None:
        raise KeyboardInterrupt

    with pytest.raises(SystemExit) as ended:
        run_reporting_errors(interrupted, debug=False)
    assert ended.value.code == 130
    assert capsys.readouterr().err.strip().splitlines() == [
        'interrupted (checkpoints are written whole or not at all): continue a training with '
        'the same command and --resume']


def test_an_empty_work_dir_is_one_line(tmp_path):
    result = run_tool('tools/train.py', str(TINY_VIT), '--work-dir', '', check=False)
    assert result.returncode == 1
    assert result.stderr.strip().splitlines() == [
        'error: --work-dir is empty: give a directory, or leave the option out for '
        './work_dirs/<config name>']
