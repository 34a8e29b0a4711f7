"""tools/parity.py: the runs it derives from a config, its summary, and a real two-run suite."""
from __future__ import annotations

import json

import pytest
from mmengine.config import Config

from mmdropit.parity import ParityJob, job_config, markdown_table, summarize, with_gamma
from tests.conftest import ROOT, TINY_VIT, TINY_VIT_DROPIT, run_tool

SUITE_CONFIGS = [
    'configs/tiny/parity/vit-tiny_6e_mnist5k.py',
    'configs/tiny/parity/resnet18_1e_mnist5k.py',
    'configs/tiny/parity/faster-rcnn_r18-w32_fpn_2e_digits128.py',
    'configs/tiny/parity/mask-rcnn_r18-w32_fpn_2e_digits128.py',
]


def test_gamma_zero_is_the_config_without_dropit_and_other_gammas_keep_hook_settings(tmp_path):
    job = ParityJob(str(TINY_VIT_DROPIT), gamma=0, seed=3, work_dir=str(tmp_path))
    cfg = job_config(job)
    assert [hook['type'] for hook in cfg.custom_hooks] == ['MemoryReportHook']
    assert cfg.randomness.seed == 3 and cfg.work_dir == str(tmp_path)
    assert cfg.default_hooks.checkpoint.interval == -1

    dropit = job_config(ParityJob(str(TINY_VIT_DROPIT), 0.5, 0, str(tmp_path))).custom_hooks[0]
    assert dropit == dict(type='DropITHook', gamma=0.5, strategy='mink', audit=True)
    added = job_config(ParityJob(str(TINY_VIT), 0.7, 0, str(tmp_path),
                                 cfg_options={'train_cfg.max_epochs': 1}))
    assert dict(type='DropITHook', gamma=0.7, strategy='mink') in added.custom_hooks
    assert added.train_cfg.max_epochs == 1


def test_gamma_out_of_range_is_refused():
    with pytest.raises(ValueError, match=r'\[0, 1\)'):
        with_gamma(Config(dict(custom_hooks=[])), 1.0)


def test_summary_compares_with_the_baseline_and_checks_the_target():
    def run(gamma, seed, top1):
        return dict(model='vit', gamma=gamma, seed=seed, metrics={'top1': top1}, seconds=2.0,
                    memory={'saved_activation_mib': 100 * (1 - gamma / 2),
                            'activation_peak_mib': 120.0, 'step_peak_mib': 150.0})

    runs = [run(0, 0, 90.0), run(0, 1, 92.0), run(0.9, 0, 89.0), run(0.9, 1, 90.0),
            run(0.5, 0, 91.0), dict(model='vit', gamma=0.5, seed=1, error='RuntimeError: x')]
    rows = {row['gamma']: row for row in summarize(runs)}
    assert rows[0.9]['delta'] == pytest.approx(-1.5) and rows[0.9]['met'] is False
    assert rows[0.5]['values'] == [91.0] and rows[0.5]['met'] is None  # no target at 0.5
    paired = rows[0.9]['paired']  # differences -1 and -2: t(0.975, 1) = 12.706
    assert paired['mean'] == pytest.approx(-1.5)
    assert paired['high'] - paired['mean'] == pytest.approx(12.706 * 0.5, rel=1e-4)
    assert rows[0.5]['paired'] is None  # one seed only
    assert rows[0.9]['memory']['saved']['ratio'] == pytest.approx(0.55)
    table = markdown_table(list(rows.values()))
    assert ('| vit | 0.9 | top1 | 89.0, 90.0 | 89.50 +/- 0.71 | -1.50 | -1.50 [-7.85, +4.85] (n=2) '
            '| missed (>= -0.5) |') in table


def test_suite_configs_load_with_their_datasets_and_from_scratch_detectors():
    for path in SUITE_CONFIGS:
        cfg = Config.fromfile(ROOT / path)
        assert cfg.train_cfg.max_epochs <= 8, path
    detector = Config.fromfile(ROOT / SUITE_CONFIGS[3])
    assert detector.model.type == 'MaskRCNN'
    assert detector.model.backbone.frozen_stages == -1 and not detector.model.backbone.norm_eval
    assert detector.train_dataloader.dataset.data_root == 'data/digit_coco128/'
    assert detector.val_evaluator.ann_file.startswith('data/digit_coco128/')


@pytest.mark.slow
def test_two_runs_in_parallel_write_table_json_and_plot(tmp_path):
    out = tmp_path / 'parity'
    result = run_tool(
        'tools/parity.py', str(TINY_VIT), '--gammas', '0,0.9', '--seeds', '0', '--jobs', '2',
        '--out', str(out), '--cfg-options', 'train_cfg.max_epochs=1', 'train_cfg.val_interval=1',
        'train_dataloader.dataset.indices=640', timeout=900)
    assert 'vit-tiny_mnist5k gamma 0.9 seed 0: top1' in result.stdout
    saved = json.loads((out / 'parity.json').read_text())
    assert saved['provenance']['command'].startswith('python ')
    runs = {run['gamma']: run for run in saved['runs']}
    assert set(runs) == {0.0, 0.9} and all(run['metrics']['top1'] > 15 for run in runs.values())
    assert (out / 'vit-tiny_mnist5k' / 'gamma0.9_seed0' / 'run.log').read_text().count(
        'DropIT') > 0
    row = next(row for row in saved['summary'] if row['gamma'] == 0.9)
    assert row['memory']['saved']['ratio'] < 0.8  # DropIT really ran in that worker
    assert (out / 'parity.png').stat().st_size > 10_000
    assert 'Command: `python' in (out / 'parity.md').read_text()


@pytest.mark.slow
def test_a_failed_run_is_reported_and_the_tool_exits_non_zero(tmp_path):
    result = run_tool('tools/parity.py', str(TINY_VIT), '--gammas', '0', '--seeds', '0',
                      '--jobs', '1', '--out', str(tmp_path),
                      '--cfg-options', 'model.model_name=no_such_model', check=False)
    assert result.returncode != 0
    assert 'failed' in result.stdout and 'run.log' in result.stdout
    assert json.loads((tmp_path / 'parity.json').read_text())['runs'][0]['error']
