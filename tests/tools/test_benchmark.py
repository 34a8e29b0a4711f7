"""tools/benchmark.py end to end on the smallest model."""
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _benchmark(*args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    """``tools/benchmark.py`` with ``args``, run from the repository root."""
    return subprocess.run([sys.executable, str(ROOT / 'tools' / 'benchmark.py'), *args],
                          cwd=ROOT, capture_output=True, text=True, timeout=timeout)


@pytest.mark.slow
def test_quick_benchmark_writes_table_json_and_plot(tmp_path):
    out = tmp_path / 'bench'
    run = _benchmark('--quick', '--models', 'deit_tiny', '--out', str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    assert '[1/1] deit_tiny, batch 4, cpu' in run.stdout

    rows = {row['variant']: row for row in json.loads((out / 'benchmark.json').read_text())['rows']}
    assert list(rows) == ['baseline', 'grad-ckpt', 'bf16-autocast', 'dropit-mink',
                          'dropit-approx', 'dropit-no-lean', 'ckpt-plan-min', 'ckpt-plan-0.5',
                          'dropit+ckpt-plan-min']
    base = rows['baseline']
    assert [base[key] for key in ('saved_ratio', 'peak_ratio', 'activation_peak_ratio',
                                  'time_ratio')] == [1.0, 1.0, 1.0, 1.0]
    assert base['saved_bytes'] > 0 and base['peak']['by_category']['parameter'] > 0
    assert rows['grad-ckpt']['saved_ratio'] < 0.5
    assert rows['grad-ckpt']['activation_peak_ratio'] < 1
    assert rows['bf16-autocast']['saved']['by_dtype'].get('bfloat16', 0) > 0
    for name in ('dropit-mink', 'dropit-approx'):  # bitmasks + values of the Linear inputs
        assert rows[name]['saved']['by_dtype'].get('uint8', 0) > 0
        assert 0.6 < rows[name]['saved_ratio'] < 0.75

    assert rows['ckpt-plan-min']['activation_peak_ratio'] < 0.5
    assert rows['ckpt-plan-0.5']['activation_peak_ratio'] < 0.6
    # DropIT lowers what the plan keeps (its peak need not fall: recomputed DropIT layers add
    # their own temporaries, see docs/benchmarks.md)
    assert rows['dropit+ckpt-plan-min']['saved_ratio'] < rows['ckpt-plan-min']['saved_ratio']
    assert 'Checkpoint plan (' in run.stdout

    table = (out / 'benchmark.md').read_text()
    assert '| deit_tiny | baseline |' in table and '| 1.00 |' in table
    assert table.count('| deit_tiny |') == 9
    assert (out / 'benchmark.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


@pytest.mark.slow
def test_config_workload_measures_the_tiny_vit_on_its_real_batch(tmp_path):
    out = tmp_path / 'bench'
    config = ROOT / 'configs' / 'tiny' / 'vit-tiny_mnist5k.py'
    run = _benchmark('--config', str(config), '--variants', 'grad-ckpt,micro-4,micro-budget-0.5',
                     '--steps', '1', '--out', str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((out / 'benchmark.json').read_text())
    rows = {row['variant']: row for row in result['rows']}
    assert list(rows) == ['baseline', 'grad-ckpt', 'micro-4', 'micro-budget-0.5']
    assert {row['model'] for row in rows.values()} == {'vit-tiny_mnist5k'}
    # timm's set_grad_checkpointing was found inside TimmClassifier
    assert rows['grad-ckpt']['saved_ratio'] < 0.5
    # four micro-batches of the real batch of 32: about a quarter of the activations at once
    assert rows['micro-4']['activation_peak_ratio'] < 0.4
    decision = result['meta']['micro_batch_decisions']['vit-tiny_mnist5k / 0.5']
    assert 'micro-batch(es) of at most' in decision['text'] and decision['micro_batches'] > 1
    assert rows['micro-budget-0.5']['peak']['peak_bytes'] <= decision['budget_bytes']


@pytest.mark.slow
def test_a_compiled_run_names_its_mode_and_compiles_dropit_whole(tmp_path):
    out = tmp_path / 'compiled'
    config = ROOT / 'configs' / 'tiny' / 'vit-tiny_mnist5k.py'
    run = _benchmark('--config', str(config), '--compile', 'reduce-overhead', '--variants',
                     'dropit-mink', '--steps', '1', '--device', 'cpu', '--out', str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    meta = json.loads((out / 'benchmark.json').read_text())['meta']
    assert meta['compile_mode'] == 'reduce-overhead'
    assert meta['graph_breaks'] == {'vit-tiny_mnist5k / baseline': 0,
                                    'vit-tiny_mnist5k / dropit-mink': 0}
    assert 'inductor, mode reduce-overhead' in (out / 'benchmark.md').read_text()


def test_an_unknown_compile_mode_is_one_line():
    run = _benchmark('--compile', 'fastest')
    assert run.returncode == 2 and 'Traceback' not in run.stderr
    assert "argument --compile: invalid choice: 'fastest'" in run.stderr


def test_a_bad_detection_image_size_is_one_line():
    run = _benchmark('--det-image-size', '1333')
    assert run.returncode == 2 and 'Traceback' not in run.stderr
    assert "'1333' is not WIDTHxHEIGHT (e.g. 1333x800)" in run.stderr


@pytest.mark.parametrize('args,message', [
    (['--frontier', '--budget'], '--frontier is a run of its own'),
    (['--frontier', '--compile'], '--frontier is a run of its own'),
    (['--frontier', '--variants', 'micro-3'], "unknown variant ['micro-3']"),
])
def test_a_frontier_run_refuses_what_does_not_go_with_it_in_one_line(args, message):
    run = _benchmark(*args)
    assert run.returncode != 0 and 'Traceback' not in run.stderr
    assert run.stderr.strip().startswith(message)


@pytest.mark.slow
def test_a_frontier_run_marks_each_point_and_draws_the_frontier(tmp_path):
    out = tmp_path / 'frontier'
    config = ROOT / 'configs' / 'tiny' / 'vit-tiny_mnist5k.py'
    run = _benchmark('--config', str(config), '--frontier', '--variants',
                     'grad-ckpt,micro-2+bf16,budget-0.5', '--steps', '1', '--device', 'cpu',
                     '--out', str(out))
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads((out / 'benchmark.json').read_text())
    assert [row['variant'] for row in result['rows']] == [
        'baseline', 'bf16-autocast', 'grad-ckpt', 'micro-2+bf16', 'budget-0.5']
    points = {row['name']: row for row in result['meta']['frontier']['vit-tiny_mnist5k']}
    assert points['micro-2+bf16']['precision'] == 'bf16' and points['budget-0.5']['ours']
    assert points['bf16-autocast']['peak_ratio'] == 1.0 == points['baseline']['time_ratio']
    assert points['budget-0.5']['budget_bytes'] > 0
    assert '## Frontier: peak against time' in (out / 'benchmark.md').read_text()
    assert (out / 'frontier.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    assert 'frontier.png' in run.stdout


def test_unknown_config_is_one_line(tmp_path):
    run = _benchmark('--config', 'no/such.py')
    assert run.returncode != 0 and 'Traceback' not in run.stderr
    assert 'config file(s) not found: no/such.py' in run.stderr


def test_compile_budget_on_cuda_is_one_line(tmp_path):
    run = _benchmark('--compile-budget', '--device', 'cuda', '--out', str(tmp_path))
    assert run.returncode != 0 and 'Traceback' not in run.stderr
    assert run.stderr.strip().splitlines()[-1].endswith('add --device cpu')


@pytest.mark.skipif(torch.cuda.is_available(), reason='needs a machine without a GPU')
def test_cuda_without_a_gpu_is_one_line(tmp_path):
    run = _benchmark('--quick', '--device', 'cuda', '--out', str(tmp_path))
    assert run.returncode != 0 and 'Traceback' not in run.stderr
    assert run.stderr.strip().splitlines()[-1].endswith('leave --device out')


@pytest.mark.slow
def test_checkpoint_curve_measures_the_planner_and_the_hand_made_plans(tmp_path):
    out = tmp_path / 'curve'
    run = _benchmark('--quick', '--models', 'deit_tiny', '--curve', '--out', str(out),
                     timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    rows = {row['variant']: row for row in json.loads((out / 'benchmark.json').read_text())['rows']}
    for name in ('grad-ckpt', 'ckpt-mmengine', 'ckpt-sqrt', 'ckpt-ogc', 'ckpt-plan-min',
                 'ckpt-budget-0.5'):
        assert rows[name]['activation_peak_ratio'] < 1, name
    least = rows['ckpt-plan-min']['activation_peak_ratio']
    for name in ('grad-ckpt', 'ckpt-mmengine', 'ckpt-sqrt', 'ckpt-ogc'):
        assert least <= rows[name]['activation_peak_ratio'] * 1.05, name
    assert rows['ckpt-budget-0.5']['activation_peak_ratio'] <= 0.55
    assert (out / 'checkpoint_curve.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
