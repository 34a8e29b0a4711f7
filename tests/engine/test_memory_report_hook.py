"""MemoryReportHook measures real training iterations and logs through MMEngine."""
from __future__ import annotations

import json
import re

import pytest
import torch
from mmengine.config import Config
from mmengine.runner import Runner

import mmdropit  # noqa: F401
from mmdropit.memory import SavedTensorMeter
from tests.conftest import TINY_VIT, log_text


def _runner(tmp_path, interval: int) -> Runner:
    cfg = Config.fromfile(TINY_VIT)
    cfg.train_cfg = dict(by_epoch=False, max_iters=3, val_interval=100)
    cfg.train_dataloader.sampler.shuffle = False
    cfg.param_scheduler = None
    cfg.custom_hooks = [dict(type='MemoryReportHook', interval=interval)]
    cfg.default_hooks.logger.interval = 1
    cfg.work_dir = str(tmp_path)
    return Runner.from_cfg(cfg)


def _scalars(runner: Runner) -> list[dict]:
    path = f'{runner.log_dir}/vis_data/scalars.json'
    with open(path) as stream:
        return [json.loads(line) for line in stream]


def test_logs_the_saved_bytes_that_the_meter_measures(tmp_path):
    runner = _runner(tmp_path, interval=2)
    runner.train()
    memory = [row for row in _scalars(runner) if 'memory/saved_activation_mib' in row]
    assert [row['step'] for row in memory] == [1, 2]  # the first iteration, then every 2nd
    row = memory[0]
    assert row['memory/step_peak_mib'] >= row['memory/activation_peak_mib'] > 0
    assert row['memory/parameter_mib'] == pytest.approx(
        sum(p.numel() * 4 for p in runner.model.parameters()) / 2 ** 20, rel=0.01)

    batch = next(iter(runner.train_dataloader))
    data = runner.model.data_preprocessor(batch, training=True)
    with SavedTensorMeter(runner.model) as meter:
        runner.model(**data, mode='loss')['loss'].backward()
    assert row['memory/saved_activation_mib'] == pytest.approx(
        meter.result.total_bytes / 2 ** 20, abs=1e-6)


@pytest.mark.slow
def test_under_compile_the_step_compiles_and_the_second_iteration_is_measured(tmp_path):
    """Measured with MemTracker's dispatch mode on its first iteration, the train step was
    never compiled (dynamo skips it then, and for good): now the compiled step's peak is
    measured on the second iteration, saved activations left out."""
    from torch._dynamo.utils import counters

    runner = _runner(tmp_path, interval=2)
    runner.cfg.compile = True  # read by Runner.train
    torch._dynamo.reset()
    counters.clear()
    runner.train()
    captured = counters['stats']['calls_captured']
    torch._dynamo.reset()
    assert captured > 100, dict(counters['stats'])  # the forward and backward, not skipped
    memory = [row for row in _scalars(runner) if 'memory/step_peak_mib' in row]
    assert [row['step'] for row in memory] == [2]
    assert 'memory/saved_activation_mib' not in memory[0]
    assert memory[0]['memory/step_peak_mib'] > 0
    assert 'saved activations not measured under compile' in log_text(tmp_path)


def test_unmeasured_iterations_are_left_alone(tmp_path):
    runner = _runner(tmp_path, interval=100)
    runner.train()
    rows = [row for row in _scalars(runner) if 'memory/step_peak_mib' in row]
    assert [row['step'] for row in rows] == [1]
    assert re.findall(r'mmdropit: MemoryReportHook: .*', log_text(tmp_path)) == [
        f"mmdropit: MemoryReportHook: iteration 1: step peak {rows[0]['memory/step_peak_mib']:.1f} "
        f"MiB, saved activations {rows[0]['memory/saved_activation_mib']:.1f} MiB (measured again "
        'every 100 iterations)']


def test_interval_must_be_positive():
    from mmdropit.engine.hooks import MemoryReportHook

    with pytest.raises(ValueError, match='interval'):
        MemoryReportHook(interval=0)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs CUDA')
def test_cuda_peak_counters_are_not_reset(tmp_path):
    runner = _runner(tmp_path, interval=1)
    torch.cuda.reset_peak_memory_stats()
    ballast = torch.empty(256 * 2 ** 20, dtype=torch.uint8, device='cuda')
    del ballast
    peak_before = torch.cuda.max_memory_allocated()
    hook = runner._hooks[[type(h).__name__ for h in runner._hooks].index('MemoryReportHook')]
    hook.before_train_iter(runner, 0)
    hook.after_train_iter(runner, 0)
    assert torch.cuda.max_memory_allocated() >= peak_before >= 256 * 2 ** 20
