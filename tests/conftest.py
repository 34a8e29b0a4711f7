"""Shared fixtures: the repository root, a runner for our command-line tools, tiny data."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TINY_VIT = ROOT / 'configs' / 'tiny' / 'vit-tiny_mnist5k.py'
TINY_FRCNN = ROOT / 'configs' / 'tiny' / 'faster-rcnn_r18_fpn_digits.py'

# Two iterations of the tiny ViT (batch 32) and a 100-image validation.
TINY_VIT_2_ITERS = [
    'train_cfg.max_epochs=1', 'train_dataloader.dataset.indices=64',
    'val_dataloader.dataset.indices=100', 'default_hooks.logger.interval=1',
]
TINY_VIT_DROPIT = ROOT / 'configs' / 'tiny' / 'vit-tiny_dropit-mink0.9_mnist5k.py'
# Config lines that switch a config to FlexibleRunner with DDP (append to a config file).
FLEXIBLE_RUNNER = "runner_type = 'FlexibleRunner'\nstrategy = dict(type='DDPStrategy')\n"


def two_iteration_cfg(path: Path, work_dir: Path, *hooks: dict):
    """The config at ``path`` cut to two training iterations (``TINY_VIT_2_ITERS``), logging
    every iteration into ``work_dir``, with ``hooks`` appended to its custom hooks."""
    from mmengine.config import Config

    cfg = Config.fromfile(path)
    cfg.train_cfg.max_epochs = 1
    cfg.train_dataloader.dataset.indices = 64
    cfg.val_dataloader.dataset.indices = 100
    cfg.default_hooks.logger.interval = 1
    cfg.custom_hooks = [*cfg.get('custom_hooks', []), *hooks]
    cfg.work_dir = str(work_dir)
    # MMEngine names a run's logger after the config and the second it started, and a second
    # runner of the same second in this process would write into the first one's log file
    cfg.experiment_name = f'{work_dir.name}-{uuid.uuid4().hex[:8]}'
    return cfg


def log_text(work_dir: Path) -> str:
    """Everything MMEngine logged under ``work_dir``."""
    return '\n'.join(path.read_text() for path in work_dir.glob('*/*.log'))


def run_tool(*args: str, env: dict | None = None, timeout: int = 600,
             check: bool = True) -> subprocess.CompletedProcess:
    """Run ``python <args>`` from the repository root, as a user would."""
    full_env = dict(os.environ, **(env or {}))
    full_env['PYTHONPATH'] = os.pathsep.join(
        filter(None, [str(ROOT), (env or {}).get('PYTHONPATH'), os.environ.get('PYTHONPATH')]))
    result = subprocess.run([sys.executable, *args], cwd=ROOT, env=full_env, text=True,
                            capture_output=True, timeout=timeout)
    if check and result.returncode != 0:
        raise AssertionError(f'{args} exited {result.returncode}\n{result.stdout[-4000:]}\n'
                             f'{result.stderr[-4000:]}')
    return result


def one_line_error(result: subprocess.CompletedProcess) -> str:
    """The one ``error:`` line of a tool that failed without a traceback."""
    assert result.returncode != 0
    assert 'Traceback' not in result.stderr, result.stderr[-3000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith('error:')]
    assert len(lines) == 1, result.stderr[-3000:]
    return lines[0]


def assert_one_line_error(work_dir: Path, config_lines: str, message: str) -> None:
    """``tools/train.py`` on the tiny ViT with ``config_lines`` appended fails before training
    with one ``error:`` line containing ``message`` and no traceback."""
    config = work_dir / 'config.py'
    config.write_text(f"_base_ = r'{TINY_VIT}'\n{config_lines}\n")
    result = run_tool('tools/train.py', str(config), '--work-dir', str(work_dir),
                      '--cfg-options', *TINY_VIT_2_ITERS, check=False)
    error = one_line_error(result)
    assert message in error, result.stderr[-3000:]


def free_port() -> int:
    """A TCP port nobody listens on (for a torchrun rendezvous)."""
    with socket.socket() as sock:
        sock.bind(('127.0.0.1', 0))
        return sock.getsockname()[1]


def run_dist_train(config: str, nproc: int, *args: str,
                   check: bool = True) -> subprocess.CompletedProcess:
    """``bash tools/dist_train.sh CONFIG NPROC ARGS`` on CPU processes (gloo), one thread each;
    ``check``: raise when it fails."""
    env = {'PORT': str(free_port()), 'OMP_NUM_THREADS': '1',
           'PATH': f'{Path(sys.executable).parent}{os.pathsep}{os.environ["PATH"]}'}
    return run_tool('-c', 'import subprocess, sys; sys.exit(subprocess.call(sys.argv[1:]))',
                    'bash', 'tools/dist_train.sh', config, str(nproc), *args, env=env,
                    check=check)


def train_on_two_ranks(work_dir: Path, hooks: str, runner: str = '') -> str:
    """Train ``TINY_VIT_DROPIT`` for two iterations (batch 16 per rank) on two gloo processes with
    the custom hooks ``hooks`` (config text) and ``SaveRankStateHook``; ``runner`` is appended
    to the config (e.g. ``FLEXIBLE_RUNNER``). Returns the log."""
    config = work_dir / 'config.py'
    config.write_text(
        f"_base_ = r'{TINY_VIT_DROPIT}'\n"
        "custom_imports = dict(imports=['mmdropit', 'tests.helpers.rank_state_hook'], "
        "allow_failed_imports=False)\n"
        f"custom_hooks = [{hooks}, dict(type='SaveRankStateHook')]\n" + runner)
    result = run_dist_train(str(config), 2, '--work-dir', str(work_dir), '--cfg-options',
                            *TINY_VIT_2_ITERS, 'train_dataloader.batch_size=16')
    return result.stdout + result.stderr


def assert_ranks_identical(work_dir: Path) -> dict:
    """Assert that the two ranks of :func:`train_on_two_ranks` ended with equal states; return
    rank 0's final state."""
    import torch

    states = [torch.load(work_dir / f'rank{rank}_final.pt') for rank in (0, 1)]
    for key, value in states[0].items():
        assert torch.equal(value, states[1][key]), key
    return states[0]


def digit_coco_options(root: Path) -> list[str]:
    """``--cfg-options`` that point the digits detection configs at ``root``."""
    ann = root / 'annotations' / 'instances_val.json'
    return [f'train_dataloader.dataset.data_root={root}/',
            f'val_dataloader.dataset.data_root={root}/',
            f'test_dataloader.dataset.data_root={root}/',
            f'val_evaluator.ann_file={ann}', f'test_evaluator.ann_file={ann}']


@pytest.fixture(scope='session')
def digit_coco(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small digits-on-canvas COCO set (20 train / 10 val images)."""
    from mmdropit.data.digit_canvas import make_digit_coco

    root = tmp_path_factory.mktemp('digit_coco')
    make_digit_coco(root, num_train=20, num_val=10)
    return root
