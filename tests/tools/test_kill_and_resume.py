"""``kill -9`` at several points of a training, then ``--resume``: the resumed run ends with
parameters bit-identical to a run that was never interrupted, and a killed checkpoint write
never leaves a part of a file where a checkpoint or ``last_checkpoint`` is read."""
from __future__ import annotations

import signal

import pytest
import torch
from mmengine.config import Config

from mmdropit.cli.checkpoint_files import is_whole
from tests.conftest import TINY_VIT_DROPIT, run_tool

# Two epochs of two iterations (batch 32), a checkpoint after each epoch, no validation.
SHORT_RUN = ['train_cfg.max_epochs=2', 'train_cfg.val_interval=100',
             'train_dataloader.dataset.indices=64', 'default_hooks.logger.interval=1',
             'randomness.seed=0']


def _train(work_dir, *flags: str, config=TINY_VIT_DROPIT, check: bool = True):
    return run_tool('tools/train.py', str(config), '--work-dir', str(work_dir), *flags,
                    '--cfg-options', *SHORT_RUN, check=check)


def _final_parameters(work_dir) -> dict[str, torch.Tensor]:
    return torch.load(work_dir / 'epoch_2.pth', weights_only=False)['state_dict']


@pytest.fixture(scope='module')
def uninterrupted(tmp_path_factory) -> dict[str, torch.Tensor]:
    work_dir = tmp_path_factory.mktemp('uninterrupted')
    _train(work_dir)
    return _final_parameters(work_dir)


@pytest.mark.parametrize('kill, keep', [
    ('after_iter=3', 0),  # mid-way through the second epoch
    ("while_writing='epoch_2.pth'", 0),  # the second checkpoint half on disk
    ("while_writing='epoch_2.pth'", 1),  # ... where only one checkpoint is kept
    ("while_writing='last_checkpoint', writes=2", 0),  # the second whole, its pointer not
    ("while_writing='last_checkpoint'", 0),  # the first checkpoint whole, no pointer yet
])
def test_a_run_killed_and_resumed_ends_bit_identical(tmp_path, uninterrupted, kill, keep):
    hooks = Config.fromfile(TINY_VIT_DROPIT).to_dict()['custom_hooks']
    config = tmp_path / 'killed.py'
    config.write_text(
        f"_base_ = r'{TINY_VIT_DROPIT}'\n"
        "custom_imports = dict(imports=['mmdropit', 'tests.helpers.kill_hook'])\n"
        f"custom_hooks = {hooks!r} + [dict(type='KillHook', {kill})]\n"
        f"default_hooks = dict(checkpoint=dict(max_keep_ckpts={keep or -1}))\n")
    killed = _train(tmp_path / 'work', config=config, check=False)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    work_dir = tmp_path / 'work'
    pointer = work_dir / 'last_checkpoint'
    if kill.endswith("'last_checkpoint'"):
        assert not pointer.exists()
    else:
        assert pointer.read_text().endswith('epoch_1.pth')
    assert (work_dir / 'epoch_1.pth').is_file()  # kept until the next one is written whole
    assert all(is_whole(str(path)) for path in work_dir.glob('*.pth'))  # no part of a file

    resumed = _train(work_dir, '--resume')
    log = resumed.stdout + resumed.stderr
    assert 'Epoch(train) [2][2/2]' in log and 'Epoch(train) [1][' not in log  # from epoch 1's
    final = _final_parameters(work_dir)
    assert final.keys() == uninterrupted.keys()
    for name, value in uninterrupted.items():
        assert torch.equal(final[name], value), name
