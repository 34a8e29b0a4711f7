"""The frontier (mmdropit.bench.frontier) on made-up points, its variants, its run's choice of
variants, and its section of a run's output."""
from __future__ import annotations

import json

import pytest
import torch
from torch import nn

from mmdropit.bench import BASELINE, SuiteResults, SuiteSettings, Workload, catalogue
from mmdropit.bench.frontier import (Point, budget_variant, dominates, frontier_markdown,
                                     frontier_points, place)
from mmdropit.bench.harness import benchmark_workload
from mmdropit.bench.report import Measurement
from mmdropit.bench.selection import run_variants
from mmdropit.bench.suite import write_results
from mmdropit.bench.techniques import compiled_forward
from mmdropit.bench.variants import (FRONTIER_GPU, FRONTIER_OURS, FRONTIER_SIMPLE, Variant,
                                     frontier_run)
from mmdropit.memory import SavedActivations, StepPeak

MIB = 2**20


def _by_name(points):
    return {p.name: p for p in place(points)}


def test_a_point_is_dominated_only_by_one_no_worse_on_both_axes_and_better_on_one():
    placed = _by_name([Point('baseline', 100, 1.0), Point('same', 100, 1.0),
                       Point('slower', 100, 1.2), Point('lower', 50, 2.0),
                       Point('both', 40, 1.9)])
    assert placed['baseline'].on_frontier and placed['same'].on_frontier  # a tie dominates not
    assert placed['slower'].dominated_by in ('baseline', 'same')
    assert placed['lower'].dominated_by == 'both' and placed['both'].on_frontier
    assert not dominates(Point('a', 10, 1.0), Point('a', 10, 1.0))


def test_the_nearest_dominating_point_is_the_highest_peak_below():
    placed = _by_name([Point('baseline', 100, 1.0), Point('far', 10, 0.5),
                       Point('near', 80, 0.9), Point('x', 90, 1.5)])
    assert placed['x'].dominated_by == 'near'


def test_ratios_are_to_the_plain_step_of_the_same_precision():
    placed = _by_name([Point('baseline', 100, 1.0), Point('bf16-autocast', 60, 0.5, 'bf16'),
                       Point('grad-ckpt+bf16', 15, 0.65, 'bf16'),
                       Point('budget-0.5-lossy', 40, 0.6, 'lossy', ours=True)])
    ckpt = placed['grad-ckpt+bf16']
    assert ckpt.peak_ratio == 0.25 and ckpt.time_ratio == pytest.approx(1.3)
    assert ckpt.peak_vs_fp32 == 0.15 and ckpt.time_vs_fp32 == 0.65
    lossy = placed['budget-0.5-lossy']  # a lossy setting starts from the fp32 step
    assert (lossy.peak_ratio, lossy.time_ratio) == (0.4, 0.6)
    # without the bf16 plain step, the bf16 ratios are not known
    alone = _by_name([Point('baseline', 100, 1.0), Point('grad-ckpt+bf16', 15, 0.65, 'bf16')])
    assert alone['grad-ckpt+bf16'].peak_ratio is None
    assert alone['grad-ckpt+bf16'].peak_vs_fp32 == 0.15


def test_a_point_is_compared_only_with_points_at_least_as_exact():
    placed = _by_name([Point('baseline', 100, 1.0), Point('budget-0.5', 50, 1.2, ours=True),
                       Point('bf16-autocast', 60, 0.5, 'bf16'),
                       Point('micro-4+bf16', 20, 0.55, 'bf16'),
                       Point('budget-0.5-lossy', 45, 0.7, 'lossy', ours=True)])
    # bf16 + 4 micro-batches is lower and faster, but not exact: fp32 points stay
    assert placed['budget-0.5'].on_frontier and placed['baseline'].on_frontier
    assert placed['budget-0.5'].beaten_by is None
    # the lossy decision may use bf16: bf16 + 4 micro-batches dominates and beats it
    lossy = placed['budget-0.5-lossy']
    assert lossy.dominated_by == 'micro-4+bf16' and lossy.beaten_by == 'micro-4+bf16'
    assert lossy.beaten_time == pytest.approx(0.7 / 0.55)
    # a bf16 point may lose to an exact fp32 one
    slow = _by_name([Point('baseline', 100, 1.0), Point('bad+bf16', 100, 1.5, 'bf16')])
    assert slow['bad+bf16'].dominated_by == 'baseline'


def test_ours_is_beaten_only_by_a_simple_point_more_than_the_noise_faster():
    points = [Point('baseline', 100, 1.0), Point('micro-4', 45, 1.0),
              Point('grad-ckpt', 30, 1.2), Point('ckpt-plan-min', 20, 1.0, ours=True),
              Point('budget-0.5', 50, 1.10, ours=True),  # 10%: the noise, not beaten
              Point('budget-0.25', 40, 1.35, ours=True),  # micro-4 is higher: grad-ckpt beats
              Point('budget-least', 25, 1.5, ours=True)]  # only ours is lower: not beaten
    placed = _by_name(points)
    assert placed['budget-0.5'].beaten_by is None and not placed['budget-0.5'].on_frontier
    assert placed['budget-0.25'].beaten_by == 'grad-ckpt'
    assert placed['budget-0.25'].beaten_time == pytest.approx(1.35 / 1.2)
    assert placed['budget-least'].beaten_by is None
    assert placed['budget-least'].dominated_by == 'ckpt-plan-min'  # dominated, by ours
    assert placed['micro-4'].beaten_by is None  # baselines are not checked
    # a wider tolerance forgives budget-0.25
    assert {p.name: p for p in place(points, tolerance=0.2)}['budget-0.25'].beaten_by is None


def test_a_budget_decision_is_set_beside_the_fastest_other_point_that_fits_its_budget():
    placed = _by_name([Point('baseline', 100, 1.0), Point('micro-2', 55, 0.9),
                       Point('micro-4', 45, 1.0), Point('grad-ckpt', 30, 1.2),
                       Point('budget-0.5', 49, 1.3, ours=True, budget_bytes=50),
                       Point('budget-0.1', 9, 2.0, ours=True, budget_bytes=10),
                       Point('budget-0.3', 28, 1.1, ours=True, budget_bytes=30)])
    assert placed['budget-0.5'].fastest_fitting == 'micro-4'
    assert placed['budget-0.5'].vs_fastest_fitting == pytest.approx(1.3)
    assert placed['budget-0.1'].fastest_fitting is None  # nothing else fits
    assert placed['budget-0.3'].fastest_fitting == 'grad-ckpt'  # faster than it: below 1
    assert placed['budget-0.3'].vs_fastest_fitting == pytest.approx(1.1 / 1.2)
    assert placed['micro-2'].fastest_fitting is None  # not a decision


def test_an_unknown_precision_is_refused():
    with pytest.raises(ValueError, match="unknown precision 'int3'"):
        place([Point('baseline', 100, 1.0), Point('odd', 10, 1.0, 'int3')])


def test_the_table_names_what_dominates_and_the_checks_that_failed():
    placed = place([Point('baseline', 100 * MIB, 1.0), Point('micro-4', 45 * MIB, 1.0),
                    Point('budget-0.5', 48 * MIB, 1.25, ours=True, budget_bytes=50 * MIB)])
    lines = frontier_markdown(placed).splitlines()
    assert lines[2].startswith('| baseline | fp32 | simple | 100.0 | 1.00 | 1.00 | 1.00 |')
    assert lines[4] == ('| budget-0.5 | fp32 | ours | 48.0 | 0.48 | 0.48 | 1.25 | 1.25 | '
                        'micro-4 | **micro-4** (1.25x) | micro-4 (1.25x) |')
    assert lines[-2].endswith('at an equal or lower peak: budget-0.5 (by micro-4, 1.25x)')
    assert lines[-1].endswith('fits their budget: budget-0.5 (1.25x micro-4)')
    clean = frontier_markdown(place([Point('baseline', MIB, 1.0)])).splitlines()
    assert clean[-2].endswith(': none') and clean[-1].endswith(': none')


def test_every_budget_decision_key_names_a_variant_of_the_catalogue():
    variants = catalogue()
    for budget in ('0.5', '0.25', 'least'):
        for lossy, rest in (('False', ''), ('True', ''), ('False', '-offload'),
                            ('False', '-bfloat16'), ('False', '-offload-bfloat16'),
                            ('False', '-bfloat16-compiled')):
            name = budget_variant(f'{budget}-{lossy}{rest}')
            assert name in variants or 'least' in name and ('offload' in name
                                                            or 'compile' in name), name


def test_points_come_from_a_runs_rows_with_their_budgets():
    rows = [dict(model='m', variant=name, peak_bytes=peak, time_ratio=time)
            for name, peak, time in [('baseline', 100, 1.0), ('budget-0.5+bf16', 30, 0.6),
                                     ('dropit-mink', 70, 1.1), ('micro-4', 40, None)]]
    kinds = {name: (variant.precision, variant.simple) for name, variant in catalogue().items()
             if name != 'dropit-mink'}
    points = frontier_points(rows, kinds, {'m / 0.5-False-bfloat16': dict(budget_bytes=35)})
    assert points['m'] == [Point('baseline', 100, 1.0),
                           Point('budget-0.5+bf16', 30, 0.6, 'bf16', True, 35)]


def test_the_frontier_variants_say_their_precision_and_kind():
    variants = catalogue()
    for name in frontier_run('cuda'):
        variant = variants[name]
        assert variant.simple == (name in FRONTIER_SIMPLE or name.startswith('compile')), name
        bf16 = name == 'bf16-autocast' or name.endswith('+bf16')
        lossy = name.endswith('-lossy') or name.startswith('dropit')
        assert variant.precision == ('lossy' if lossy else 'bf16' if bf16 else 'fp32'), name
    assert {name for name in variants if name.startswith('compile')} == {
        'compile', 'compile+bf16', 'compile+grad-ckpt+bf16'}
    assert all(variants[name].compiled for name in FRONTIER_GPU if name.startswith('compile'))
    assert not set(FRONTIER_OURS) & set(FRONTIER_SIMPLE)


def test_a_frontier_run_on_a_cpu_leaves_compile_and_offload_out():
    on_cpu, on_gpu = run_variants(frontier=True), run_variants(frontier=True, device='cuda')
    assert on_gpu == [*on_cpu, *FRONTIER_GPU] and not set(on_cpu) & set(FRONTIER_GPU)
    assert on_cpu[:2] == [BASELINE, 'grad-ckpt'] and 'budget-least+bf16' in on_cpu
    assert run_variants('budget-0.5+bf16,budget-0.5', frontier=True) == [
        'bf16-autocast', 'budget-0.5+bf16', 'budget-0.5']
    with pytest.raises(ValueError, match='--frontier is a run of its own'):
        run_variants(frontier=True, compiled=True)
    with pytest.raises(ValueError, match="unknown variant \\['micro-3'\\]"):
        run_variants('micro-3', frontier=True)


def _mlp_workload() -> Workload:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.Linear(32, 4))
    images, labels = torch.randn(8, 16), torch.randint(0, 4, (8,))
    return Workload('mlp', model, lambda: nn.functional.cross_entropy(model(images), labels),
                    lambda on: None, 8)


def test_a_compiled_variant_puts_the_forward_back_and_compiles_once_per_workload():
    work = _mlp_workload()
    with compiled_forward(work):
        compiled = work.model.forward
        assert compiled is work.compiled_forward
    assert 'forward' not in vars(work.model)
    with compiled_forward(work):
        assert work.model.forward is compiled
    work.model.forward = marker = lambda x: x  # an earlier instance attribute stays
    with compiled_forward(work):
        pass
    assert work.model.forward is marker


def test_the_harness_takes_an_unmetered_step_first_for_a_compiling_variant():
    work = _mlp_workload()
    variants = [catalogue()[BASELINE], Variant('flagged', compiled=True)]
    measured, skipped = benchmark_workload(work, variants, steps=1, device=torch.device('cpu'))
    assert not skipped and [m.variant for m in measured] == [BASELINE, 'flagged']
    assert work.graph_breaks == {'flagged': 0}


def test_a_frontier_run_writes_its_table_json_and_plot(tmp_path):
    def measured(name: str, peak: int, ratio: float) -> Measurement:
        return Measurement('m', name, SavedActivations(peak // 2), StepPeak('cpu', peak * MIB),
                           ratio, time_ratio=ratio)

    results = SuiteResults([measured(BASELINE, 100, 1.0), measured('micro-4', 45, 1.0),
                            measured('bf16-autocast', 60, 0.5),
                            measured('grad-ckpt+bf16', 20, 0.6),
                            measured('ckpt-plan-min', 30, 1.3)])
    settings = SuiteSettings(8, 2, 1, torch.device('cpu'))
    table = write_results(results, settings, tmp_path, frontier=True)
    assert '## Frontier: peak against time' in table and '### m' in table
    assert '| grad-ckpt+bf16 | bf16 | simple | 20.0 | 0.33 | 0.20 | 1.20 | 0.60 | frontier |' \
        in table
    meta = json.loads((tmp_path / 'benchmark.json').read_text())['meta']
    rows = {row['name']: row for row in meta['frontier']['m']}
    assert rows['ckpt-plan-min']['on_frontier'] and rows['ckpt-plan-min']['ours']
    assert rows['micro-4']['on_frontier'] and not rows['micro-4']['ours']
    assert (tmp_path / 'frontier.png').read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'
    assert '## Frontier' in (tmp_path / 'benchmark.md').read_text()
