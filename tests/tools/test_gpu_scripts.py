"""tools/gpu: what can be checked of the GPU run without a GPU -- the carried versions, the
stages each script would run, the summary table."""
from __future__ import annotations

import os
import re
import subprocess
from importlib.metadata import requires
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from mmdropit.bench.report import Measurement, write_json
from mmdropit.memory import SavedActivations, StepPeak
from tests.conftest import ROOT, run_tool

GPU = ROOT / 'tools' / 'gpu'


def _pins() -> dict[str, str]:
    pins = {}
    for line in (GPU / 'carry.txt').read_text().splitlines():
        line = line.removeprefix('source:').strip()
        if line and not line.startswith('#'):
            name, pinned = line.split('==')
            pins[name] = pinned
    return pins


def _setup_env_pins() -> dict[str, str]:
    script = (ROOT / 'tools' / 'setup_env.sh').read_text()
    return dict(re.findall(r'"([A-Za-z0-9_.-]+)==([0-9][^"]*)"', script))


def test_the_carried_versions_are_the_ones_make_env_pins():
    pins, pinned_here = _pins(), _setup_env_pins()
    assert {'mmengine', 'mmdet', 'mmcv', 'mlxtend'} <= set(pins) & set(pinned_here)
    assert {name: pins[name] for name in pins if name in pinned_here} == {
        name: pinned_here[name] for name in pins if name in pinned_here}


def test_every_carried_dependency_is_one_the_carried_packages_accept():
    """make env takes the registry's newest version of what it does not pin (platformdirs moved
    from 4.14.7 to 4.14.8 under a CI run), so an unpinned carried dependency is checked against
    what the carried packages require of it, not against this machine's install."""
    pins = {canonicalize_name(name): pinned for name, pinned in _pins().items()}
    for name in pins.keys() - {'mmcv'}:  # mmcv is built there with --no-deps
        for line in requires(name) or ():
            requirement = Requirement(line)
            needed = canonicalize_name(requirement.name)
            applies = requirement.marker is None or requirement.marker.evaluate({'extra': ''})
            if applies and needed in pins:
                assert requirement.specifier.contains(pins[needed]), \
                    f'{name} needs {requirement}; carry.txt has {pins[needed]}'


def _bash(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(['bash', *args], cwd=ROOT, capture_output=True, text=True, timeout=60)


def test_collect_downloads_every_pin_for_python_3_12():
    result = _bash(str(GPU / 'collect.sh'), '--dry-run')
    assert result.returncode == 0, result.stderr
    wheels, source = result.stdout.splitlines()[1:]
    assert '--python-version 3.12' in wheels and '--only-binary=:all:' in wheels
    assert all(f'{name}=={pinned}' in wheels for name, pinned in _pins().items()
               if name != 'mmcv')
    assert source.endswith('--no-build-isolation -d ' + str(ROOT / '.gpu' / 'src') +
                           ' mmcv==2.1.0')


def test_on_device_runs_the_stages_in_the_order_given(tmp_path):
    result = _bash(str(GPU / 'on_device.sh'), '--dry-run', str(tmp_path), 'setup',
                   'mmcv-background', 'bench', 'detect', 'summary')
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert len(lines) == 6 and not any(tmp_path.iterdir())  # a dry run writes nothing
    assert 'pip install' in lines[0] and '.gpu/wheels/' in lines[0]
    assert lines[1].startswith('setsid: build mmcv')
    assert '--device cuda --models deit_small --batch-size 64 --steps 10' in lines[2]
    assert '--models resnet50 --batch-size 64' in lines[3]
    assert '--models faster_rcnn --det-batch-size 2 --det-image-size 1333x800' in lines[4]
    assert 'tools/gpu/summary.py' in lines[5]


def test_a_stage_runs_one_model_under_a_time_limit(tmp_path):
    result = _bash(str(GPU / 'on_device.sh'), '--dry-run', str(tmp_path), 'mmcv-lite',
                   'bench-resnet50@80', 'tests')
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith('build mmcv (no ops)')
    assert lines[1].startswith('timeout 80 ') and '--models resnet50 --batch-size 64' in lines[1]
    assert f'--out {tmp_path}/bench-resnet50 ' in lines[1]
    assert lines[2].startswith('python3 -m pytest')  # the limit is the stage's own
    assert {str(ROOT / 'tests' / 'cuda'), str(ROOT / 'tests' / 'kernels')} <= set(lines[2].split())


def test_a_test_stage_is_interrupted_before_its_limit_so_that_it_reports(tmp_path):
    """pytest stopped by SIGTERM prints nothing of what failed (an H200 run lost five failures
    so): the pytest stages get SIGINT 20 s before their limit (pytest-xdist then waits up to
    10 s for its workers, and pytest prints its failures and summary) and are killed at it, a
    short limit split in halves; on the GPU image's pytest-xdist, over workers."""
    result = _bash(str(GPU / 'on_device.sh'), '--dry-run', str(tmp_path), 'kernel-tests@100',
                   'tests@0140', 'tests@30', 'bench-resnet50@80')
    assert result.returncode == 0, result.stderr
    kernel_tests, tests, short, bench = result.stdout.splitlines()
    assert kernel_tests.startswith('timeout -s INT -k 20 80 python3 -m pytest ')
    assert ' -n 8 ' in kernel_tests
    assert tests.startswith('timeout -s INT -k 20 120 python3 -m pytest -v ')
    assert ' -n 4 --dist loadfile ' in tests
    assert short.startswith('timeout -s INT -k 15 15 python3 -m pytest ')
    assert bench.startswith('timeout 80 python3 ')


def test_the_node_stages_build_the_cpu_library_and_time_the_host_on_the_gpu(tmp_path):
    result = _bash(str(GPU / 'on_device.sh'), '--dry-run', str(tmp_path), 'cpu-kernels',
                   'host-cost@30')
    assert result.returncode == 0, result.stderr
    build, linear, conv = result.stdout.splitlines()
    assert build.startswith('python3 -m mmdropit.kernels.cpu.build')
    for layer, line in (('linear', linear), ('conv', conv)):
        assert line.startswith('timeout 30 python3 -m mmdropit.bench.host_cost --device cuda ')
        assert f'--layer {layer} --json {tmp_path}/host_cost_{layer}.json' in line
        assert '--strategies mink random ' in line  # both strategies the C++ nodes select


def _stage_paths(tmp_path: Path, stage: str) -> list[Path]:
    result = _bash(str(GPU / 'on_device.sh'), '--dry-run', str(tmp_path), stage)
    assert result.returncode == 0, result.stderr
    return [Path(word) for word in result.stdout.split() if word.startswith(str(ROOT))]


def test_the_tests_stage_collects_every_file_with_cuda_tests(tmp_path):
    paths = _stage_paths(tmp_path, 'tests')
    marker = re.compile(r'^(\s*@pytest\.mark\.cuda\b|pytestmark\b.*pytest\.mark\.cuda\b)', re.M)
    marked = [path for path in (ROOT / 'tests').rglob('test_*.py')
              if marker.search(path.read_text())]
    assert len(marked) >= 10
    left_out = [path for path in marked
                if not any(path == each or each in path.parents for each in paths)]
    assert not left_out, f'CUDA tests the GPU run would not collect: {left_out}'


def test_the_kernel_tests_stage_runs_every_triton_test_file(tmp_path):
    paths = set(_stage_paths(tmp_path, 'kernel-tests'))
    assert set((ROOT / 'tests' / 'kernels').glob('test_triton*_kernels.py')) == paths


def test_the_compiled_stage_replays_deit_small_as_cuda_graphs(tmp_path):
    result = _bash(str(GPU / 'on_device.sh'), '--dry-run', str(tmp_path), 'compiled@120')
    assert result.returncode == 0, result.stderr
    line = result.stdout.strip()
    assert line.startswith('timeout 120 ') and '--models deit_small --batch-size 64' in line
    assert '--compile reduce-overhead --variants bf16-autocast,dropit-mink+bf16 ' in line


def test_the_ogc_stage_runs_the_table_at_the_papers_batch_sizes(tmp_path):
    result = _bash(str(GPU / 'on_device.sh'), '--dry-run', str(tmp_path), 'ogc')
    assert result.returncode == 0, result.stderr
    assert ('--device cuda --ogc-table --ogc-scale 1 --steps 10 --out ' + str(tmp_path / 'ogc')
            in result.stdout)


def test_the_frontier_stage_runs_each_model_at_its_batch_in_bf16(tmp_path):
    result = _bash(str(GPU / 'on_device.sh'), '--dry-run', str(tmp_path), 'frontier',
                   'frontier-resnet50@100')
    assert result.returncode == 0, result.stderr
    deit, resnet, limited = result.stdout.splitlines()
    assert '--device cuda --frontier --models deit_small --batch-size 256 --steps 5 ' in deit
    assert f'--out {tmp_path}/frontier-deit_small ' in deit
    assert '--frontier --models resnet50 --batch-size 128 ' in resnet
    assert limited.startswith('timeout 100 ') and '--models resnet50 --batch-size 128' in limited
    variants = deit.split('--variants ')[1].split()[0].split(',')
    assert {'bf16-autocast', 'grad-ckpt+bf16', 'micro-2+bf16', 'compile+bf16',
            'ckpt-plan-0.5+bf16', 'ckpt-plan-min+bf16', 'budget-0.5+bf16', 'budget-least+bf16',
            'offload-0.5+bf16', 'dropit-mink+bf16', 'ckpt-per-block+bf16',
            'ckpt-per-block-host+bf16', 'ckpt-plan-min-host+bf16',
            'budget-least-offload+bf16'} <= set(variants)
    from mmdropit.bench import catalogue
    assert set(variants) <= set(catalogue())


def test_the_kernels_stage_times_the_kernels_on_cuda_into_its_folder(tmp_path):
    result = _bash(str(GPU / 'on_device.sh'), '--dry-run', str(tmp_path), 'kernels@60',
                   'summary')
    assert result.returncode == 0, result.stderr
    kernels, summary = result.stdout.splitlines()
    assert kernels.startswith('timeout 60 python3 -m mmdropit.bench.kernel_speed ')
    assert f'{tmp_path}/kernels --device cuda' in kernels
    assert 'tools/gpu/summary.py' in summary  # the kernel table follows once it is written


@pytest.mark.parametrize('args,message', [
    ([], 'usage: bash tools/gpu/on_device.sh'),
    (['/tmp/out', 'benchmark'], "error: unknown stage 'benchmark'"),
    (['/tmp/out', 'frontier-vgg16'], "error: unknown stage 'frontier-vgg16'"),
    (['/tmp/out', 'bench@5m'], "error: stage 'bench@5m': the limit after @ must be whole seconds"),
])
def test_on_device_refuses_bad_arguments_in_one_line(args, message):
    result = _bash(str(GPU / 'on_device.sh'), *args)
    assert result.returncode == 2 and result.stderr.startswith(message)


def test_the_summary_is_one_row_per_variant(tmp_path):
    rows = [Measurement('deit_small', name, SavedActivations(saved), StepPeak('cuda', peak),
                        seconds, host_seconds=host) for name, saved, peak, seconds, host in
            [('baseline', 800, 2**31, 1.0, 0.5), ('ckpt-plan-min', 200, 2**30, 1.25, 1.2)]]
    (tmp_path / 'bench').mkdir()
    write_json(rows, tmp_path / 'bench' / 'benchmark.json', meta={'device': 'cuda'})
    table = run_tool('tools/gpu/summary.py', str(tmp_path)).stdout.splitlines()
    assert table[2].split() == ['deit_small', 'ckpt-plan-min', '0.50', '0.25', '1.25', '0.96',
                                '2.00', 'GiB', '(cuda)']
    assert 'host' in table[0].split()


def test_the_summary_ends_with_each_frontier(tmp_path):
    from mmdropit.bench.frontier import Point, place

    placed = place([Point('baseline', 100, 1.0), Point('micro-4+bf16', 20, 0.5, 'bf16'),
                    Point('bf16-autocast', 60, 0.45, 'bf16'),
                    Point('budget-0.5+bf16', 30, 0.6, 'bf16', True, 50)])
    rows = [Measurement('deit_small', p.name, SavedActivations(1), StepPeak('cuda', 1), 1.0)
            for p in placed]
    (tmp_path / 'frontier').mkdir()
    write_json(rows, tmp_path / 'frontier' / 'benchmark.json',
               meta={'device': 'cuda', 'frontier': {'deit_small': [p.to_json() for p in placed]}})
    lines = run_tool('tools/gpu/summary.py', str(tmp_path)).stdout.splitlines()
    assert lines[-5].startswith('frontier deit_small: point')
    assert lines[-1].split() == ['budget-0.5+bf16', 'ours', '0.50', '0.30', '1.33',
                                 'micro-4+bf16', 'BEATEN', 'by', 'micro-4+bf16', '(1.20x)',
                                 'fastest', 'fitting', 'micro-4+bf16', '(1.20x)']


def _prepared_calls() -> list[tuple[int, str]]:
    """docs/gpu.md's device calls: each one's ``timeout_s`` and command."""
    text = (ROOT / 'docs' / 'gpu.md').read_text()
    return [(int(limit), command) for limit, command in
            re.findall(r"run\(carry=\['\.gpu'\], timeout_s=(\d+), command='([^']*)'\)", text)]


UNLIMITED_STAGE_SECONDS = {'setup': 10, 'mmcv-lite': 10}
"""What a stage without a limit of its own takes on the device (5 and 10 s measured)."""
RUNS_PER_LIMIT = {'host-cost': 2}  # one limited process per layer (Linear, convolution)


@pytest.mark.parametrize('call', range(2))
def test_each_prepared_call_runs_as_written_within_its_limits(tmp_path, call):
    from mmdropit.bench.variants import catalogue

    calls = _prepared_calls()
    assert len(calls) == 2
    timeout_s, command = calls[call]
    setting, script = command.split('timeout ', 1)[0], command.split('on_device.sh $R ', 1)[1]
    inner = int(re.search(r'timeout (\d+) bash tools/gpu/on_device.sh', command).group(1))
    assert inner + 15 <= timeout_s  # the archive is packed after the inner timeout
    stages = script.split(';')[0].split()
    seconds = sum(int(stage.split('@')[1]) * RUNS_PER_LIMIT.get(stage.split('@')[0], 1)
                  if '@' in stage else UNLIMITED_STAGE_SECONDS[stage] for stage in stages)
    assert seconds <= inner
    env = dict(re.findall(r'(\w+)=(\S+)', setting))
    unknown = set(env.get('VARIANTS', '').split(',')) - set(catalogue()) - {''}
    assert not unknown
    result = subprocess.run(['bash', str(GPU / 'on_device.sh'), '--dry-run', str(tmp_path),
                             *stages], capture_output=True, text=True, env={**os.environ, **env})
    assert result.returncode == 0, result.stderr
    if 'VARIANTS' in env:
        assert f"--variants {env['VARIANTS']} " in result.stdout


def test_the_snapshot_script_says_it_needs_cuda(tmp_path):
    result = run_tool('tools/gpu/memory_snapshot.py', '--out', str(tmp_path), check=False)
    assert result.returncode == 1
    assert result.stderr.strip() == ('error: memory snapshots need a CUDA device (this '
                                     'machine has none)')


def test_the_run_needs_no_path_outside_the_checkout():
    text = (GPU / 'on_device.sh').read_text()
    assert '../shared' not in text and 'pip download' not in text  # no registry there
    assert Path(ROOT / '.gitignore').read_text().count('/.gpu/') == 1
