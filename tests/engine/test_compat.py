"""The mmengine 0.10.7 / torch 2.13 shims: resume, CPU distributed, mmdet:: configs."""
from __future__ import annotations

import io
import pickle

import pytest
import torch
from mmengine.logging import HistoryBuffer

import mmdropit  # noqa: F401
from tests.conftest import TINY_FRCNN, TINY_VIT, TINY_VIT_2_ITERS, run_dist_train, run_tool


def test_resume_from_a_checkpoint_on_torch_2_13(tmp_path):
    work_dir = str(tmp_path)
    run_tool('tools/train.py', str(TINY_VIT), '--work-dir', work_dir,
             '--cfg-options', *TINY_VIT_2_ITERS)
    checkpoint = tmp_path / 'epoch_1.pth'
    plain = run_tool('-c', f'import torch; torch.load(r"{checkpoint}")', check=False)
    assert 'Weights only load failed' in plain.stderr  # why the shim exists
    resumed = run_tool('tools/train.py', str(TINY_VIT), '--work-dir', work_dir, '--resume',
                       '--cfg-options', *TINY_VIT_2_ITERS[1:], 'train_cfg.max_epochs=2')
    log = resumed.stdout + resumed.stderr
    assert 'resumed epoch: 1, iter: 2' in log
    final = torch.load(tmp_path / 'epoch_2.pth', weights_only=True)
    assert final['meta']['iter'] == 4 and final['meta']['epoch'] == 2


def test_safe_loader_allows_history_buffers_but_no_other_getattr():
    buffer = HistoryBuffer()
    buffer.update(1.5)
    stream = io.BytesIO()
    torch.save({'hub': buffer}, stream)
    stream.seek(0)
    assert torch.load(stream, weights_only=True)['hub'].mean() == 1.5

    class Reach:
        def __reduce__(self):
            return getattr, (HistoryBuffer, '__init__')

    stream = io.BytesIO()
    torch.save({'x': Reach()}, stream)
    stream.seek(0)
    with pytest.raises(pickle.UnpicklingError, match='refusing getattr'):
        torch.load(stream, weights_only=True)


def test_torchrun_two_cpu_processes_train_with_gloo(tmp_path):
    result = run_dist_train(str(TINY_VIT), 2, '--work-dir', str(tmp_path), '--cfg-options',
                            *TINY_VIT_2_ITERS, 'train_dataloader.batch_size=16')
    log = result.stdout + result.stderr
    assert 'Distributed launcher: pytorch' in log and 'Distributed training: True' in log
    assert 'GPU number: 2' in log  # mmengine's name for the world size
    assert 'Epoch(train) [1][2/2]' in log  # 64 images / (2 processes x 16)
    assert (tmp_path / 'epoch_1.pth').is_file()


MMDET_BASE_WITHOUT_PKG_RESOURCES = f'''
import sys
sys.modules["pkg_resources"] = None  # as with setuptools >= 81
{{imports}}
from mmengine.config import Config
cfg = Config.fromfile(r"{TINY_FRCNN}")
print(cfg.model.type, cfg.model.backbone.depth)
'''


def test_mmdet_base_configs_load_without_pkg_resources():
    result = run_tool('-c', MMDET_BASE_WITHOUT_PKG_RESOURCES.format(imports='import mmdropit'))
    assert result.stdout.split()[-2:] == ['FasterRCNN', '18']
    plain = run_tool('-c', MMDET_BASE_WITHOUT_PKG_RESOURCES.format(imports=''), check=False)
    assert plain.returncode != 0 and 'pkg_resources' in plain.stderr  # what the shim fixes


def test_a_resumed_message_hub_drops_the_old_runs_dropit_keep_ratio():
    from mmengine.logging import MessageHub

    old = MessageHub.get_instance('old run')
    old.update_scalar('train/dropit_keep_ratio', 0.1)
    old.update_scalar('train/loss', 2.0)
    resumed = MessageHub.get_instance('resumed run')
    resumed.load_state_dict(old.state_dict())
    assert 'train/loss' in resumed.log_scalars
    assert 'train/dropit_keep_ratio' not in resumed.log_scalars
