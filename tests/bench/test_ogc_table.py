"""The OGC paper's table: its figures, its models built offline, and our plans measured on them."""
import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from mmdropit.bench.ogc_models import OGC_ROWS, ogc_workload
from mmdropit.bench.ogc_table import (AT_PAPER_CUT, LEAST_MEMORY, PAPER_OBJECTIVE, OGCResult,
                                      PlanPoint, ogc_markdown, run_ogc_table)

ROOT = Path(__file__).resolve().parents[2]
CPU = torch.device('cpu')

# The README's own percentage columns, read separately from its MB and seconds columns.
PRINTED_CUT_AND_OVERHEAD = {
    'alexnet': (34, 34), 'vgg11': (22, 34), 'vgg13': (31, 33), 'vgg16': (31, 32),
    'vgg19': (31, 33), 'resnet18': (35, 30), 'resnet34': (55, 35), 'resnet50': (63, 31),
    'resnet101': (74, 35), 'resnet152': (81, 37), 'densenet121': (78, 34),
    'densenet161': (82, 36), 'densenet169': (82, 32), 'densenet201': (85, 53),
    'inception_v3': (71, 29), 'nasnet': (81, 31), 'amoebanet': (79, 36), 'darts': (80, 55),
}


def test_the_rows_match_the_papers_printed_percentages():
    assert list(OGC_ROWS) == list(PRINTED_CUT_AND_OVERHEAD)
    for name, (cut, overhead) in PRINTED_CUT_AND_OVERHEAD.items():
        row = OGC_ROWS[name]
        # within a point: the README rounds the MB and seconds it derives them from
        assert abs(100 * row.memory_cut - cut) <= 1, name
        assert abs(100 * row.time_overhead - overhead) <= 1, name
        assert bool(row.stand_in) == (name in ('nasnet', 'amoebanet', 'darts'))


@pytest.mark.parametrize('name', ['inception_v3', 'vgg11'])
def test_a_workload_is_the_papers_model_at_a_scaled_batch(name):
    work = ogc_workload(OGC_ROWS[name], scale=64, device=CPU)
    assert work.batch_size == 1  # 32 / 64 and 64 / 64, at least one image
    loss = work.loss()
    loss.backward()
    assert loss.ndim == 0 and next(work.model.parameters()).grad is not None


def _point(variant: str, cut: float, overhead: float) -> PlanPoint:
    return PlanPoint(variant, cut, cut / 2, overhead, 1.0)


def test_a_plan_dominates_only_with_more_cut_at_no_more_overhead():
    row = OGC_ROWS['resnet50']  # 63% at 31%
    result = OGCResult(row, 8, (), (_point(LEAST_MEMORY, 0.70, 0.45),
                                    _point(AT_PAPER_CUT, 0.64, 0.20),
                                    _point(PAPER_OBJECTIVE, 0.65, 0.10)))
    assert result.dominating() == [AT_PAPER_CUT]  # the paper's objective is not ours
    assert result.dominating(noise=0.15) == [LEAST_MEMORY, AT_PAPER_CUT]
    slower = OGCResult(row, 8, (), (_point(LEAST_MEMORY, 0.60, 0.10),))
    assert slower.dominating() == []
    table = ogc_markdown([result, slower])
    assert ('| ResNet 50 (64 -> 8) | 63% / 31% | 70% / 35% / 45% / 1.0 s | 64% / 20% | '
            '65% / 10% | at the cut |') in table
    assert table.splitlines()[-1].endswith('| failed | failed | no |')


@pytest.mark.slow
def test_rows_of_one_architecture_are_measured_once(monkeypatch):
    # as the AmoebaNet and DARTS rows share PNASNet-5; two small ResNet-18 rows stand for them
    for name in ('first', 'second'):
        monkeypatch.setitem(OGC_ROWS, name, dataclasses.replace(
            OGC_ROWS['resnet18'], name=name, our_image_size=64))
    results = run_ogc_table(['first', 'second'], scale=64, steps=1, device=CPU)  # batch 4
    assert [result.row.name for result in results] == ['first', 'second']
    assert results[0].measurements is results[1].measurements
    least = {point.variant: point for point in results[0].points}[LEAST_MEMORY]
    assert 0.1 < least.activation_cut < 1
    assert least.forward_backward_cut < least.activation_cut  # parameters weigh in
    assert least.planning_seconds > 0


@pytest.mark.slow
def test_the_command_line_writes_the_table(tmp_path):
    run = subprocess.run(
        [sys.executable, str(ROOT / 'tools' / 'benchmark.py'), '--ogc-table', '--models',
         'resnet18', '--ogc-scale', '256', '--steps', '1', '--out', str(tmp_path)],
        cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    payload = json.loads((tmp_path / 'ogc_table.json').read_text())
    assert payload['scale'] == 256 and [row['row'] for row in payload['rows']] == ['resnet18']
    variants = [m['variant'] for m in payload['rows'][0]['measurements']]
    assert variants == ['baseline', LEAST_MEMORY, AT_PAPER_CUT, PAPER_OBJECTIVE]
    assert '| ResNet 18 (256 -> 1) | 35% / 30% |' in (tmp_path / 'ogc_table.md').read_text()


@pytest.mark.parametrize('args,message', [
    (['--models', 'lenet'], "unknown OGC table row ['lenet']"),
    (['--ogc-scale', '0'], '--ogc-scale must be at least 1'),
])
def test_bad_table_arguments_are_one_line(args, message):
    run = subprocess.run([sys.executable, str(ROOT / 'tools' / 'benchmark.py'), '--ogc-table',
                          *args], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert run.returncode != 0 and 'Traceback' not in run.stderr
    assert message in run.stderr
