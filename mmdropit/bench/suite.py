"""A benchmark run: models x variants measured side by side, then written as a table, JSON and
plots.

Example::

    settings = SuiteSettings(batch_size=4, det_batch_size=2, steps=1, device=torch.device('cpu'))
    results = run_suite(['deit_tiny'], [], [catalogue()[name] for name in ('baseline',
                                                                           'grad-ckpt')], settings)
    write_results(results, settings, Path('work_dirs/benchmark'))
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..microbatch import SplitDecision
from ..planner import BudgetOutcome
from ..reporting import progress_bar, provenance, provenance_markdown
from .budget_grid import GRID_VARIANTS, LOSSY_GRID_VARIANTS, check_against_grid, grid_markdown
from .harness import benchmark_workload
from .models import DET_IMAGE_SIZE, DETECTION_MODELS, IMAGE_SIZE, MODELS, config_workload
from .frontier import frontier_points, frontier_section, place
from .plot import plot_frontier, plot_ratios, plot_tradeoff
from .report import Measurement, compare, markdown_table, progress_line, write_json
from .variants import BASELINE, BUDGET_VARIANTS, CURVE_BUDGETS, Variant, catalogue


@dataclass(frozen=True)
class SuiteSettings:
    """How every workload of a run is measured.

    Attributes:
        batch_size: Images per step for the classification models.
        det_batch_size: Images per step for detection.
        steps: Timed rounds after the measured steps.
        device: Where the models run.
        seed: Seeds torch before each model is built.
        compile: Compile each model's forward in place (:meth:`Workload.compile`, inductor)
            before it is measured: every variant then runs compiled.
        det_image_size: Detection images' (height, width).
        compile_mode: Inductor's ``mode`` when compiling: ``None`` (its default),
            ``'reduce-overhead'`` (CUDA graphs: a step replays its kernels without the host
            launching each, the fair ground for a host-bound GPU step), or another of
            ``torch.compile``'s modes.
    """

    batch_size: int
    det_batch_size: int
    steps: int
    device: torch.device
    seed: int = 0
    compile: bool = False
    compile_mode: str | None = None
    det_image_size: tuple[int, int] = DET_IMAGE_SIZE


@dataclass
class SuiteResults:
    """What a run measured.

    Attributes:
        measurements: One per (workload, variant) that ran, workloads in order.
        skipped: One line per variant that failed on a workload.
        split_decisions: Micro-batch splits searched, by ``'<workload> / <budget>'``.
        budget_outcomes: Memory-budget decisions, by ``'<workload> / <budget>-<lossy>'``.
        graph_breaks: Graph breaks of a compiled run, by ``'<workload> / <variant>'``.
    """

    measurements: list[Measurement] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    split_decisions: dict[str, SplitDecision] = field(default_factory=dict)
    budget_outcomes: dict[str, BudgetOutcome] = field(default_factory=dict)
    graph_breaks: dict[str, int] = field(default_factory=dict)


def run_suite(models: list[str], configs: list[str], variants: list[Variant],
              settings: SuiteSettings) -> SuiteResults:
    """Measure every named model of :data:`~.models.MODELS` and every config's model under
    ``variants`` (the baseline first), printing each row as it is measured.

    Args:
        models: Names from :data:`~.models.MODELS`.
        configs: Paths of MMEngine configs (their model on the first batch of their train
            dataloader).
        variants: The variants, :data:`~.variants.BASELINE` first.
        settings: Batch sizes, timed rounds, device and seed.
    """
    results = SuiteResults()
    jobs = [*models, *configs]
    device_name = settings.device.type
    with progress_bar() as progress:
        task = progress.add_task('models', total=len(jobs))
        for index, name in enumerate(jobs, start=1):
            torch.manual_seed(settings.seed)
            if name in MODELS:
                batch_size = (settings.det_batch_size if name in DETECTION_MODELS
                              else settings.batch_size)
                print(f'[{index}/{len(jobs)}] {name}, batch {batch_size}, {device_name}',
                      flush=True)
                sized = ({'image_size': settings.det_image_size} if name in DETECTION_MODELS
                         else {})
                work = MODELS[name](name, batch_size, settings.device, **sized)
            else:
                print(f'[{index}/{len(jobs)}] {name} (its train batch), {device_name}',
                      flush=True)
                work = config_workload(name, settings.device)
            if settings.compile:
                work.compile(mode=settings.compile_mode)
            measured, failed = benchmark_workload(work, variants, settings.steps,
                                                  settings.device, settings.compile)
            for row in compare(measured, BASELINE):
                print(progress_line(row), flush=True)
            for line in failed:
                print(f'  skipped {line}', flush=True)
            results.measurements.extend(measured)
            results.skipped.extend(failed)
            results.split_decisions.update(
                {f'{work.name} / {budget}': decision
                 for budget, decision in work.split_decisions.items()})
            results.budget_outcomes.update(
                {f'{work.name} / {key}': outcome for key, outcome in work.budget_outcomes.items()})
            if work.graph_breaks:  # a compiled run, or variants that compile
                results.graph_breaks.update(
                    {f'{work.name} / {key}': count for key, count in work.graph_breaks.items()})
            del work
            progress.advance(task)
    return results


def _markdown(table: str, meta: dict) -> str:
    on_cuda = meta['device'] == 'cuda'
    peak_source = 'torch.cuda.max_memory_allocated' if on_cuda else 'MemTracker'
    activation = ('not known on CUDA' if on_cuda else
                  'highest activation + temporary bytes at any moment of the step')
    skipped = ''.join(f'- {line}\n' for line in meta['skipped'])
    compiled = ('' if meta['graph_breaks'] is None else
                'Every model compiled in place (`torch.compile`, inductor, mode '
                f"{meta['compile_mode'] or 'default'}; one untimed step per "
                'variant before the metered ones compiles it without the meters); graph breaks '
                'per model / variant: ' + ', '.join(f'{key} {count}' for key, count
                                                in meta['graph_breaks'].items()) + '.\n\n')
    if meta.get('compiled_variant_graph_breaks'):
        compiled += ('Variants that compile the model (`torch.compile`, inductor, default mode; '
                     'an untimed step first, the saved tensors metered eagerly); graph breaks: '
                     + ', '.join(f'{key} {count}' for key, count
                                 in meta['compiled_variant_graph_breaks'].items()) + '.\n\n')
    return (
        '# Memory benchmark\n\n' + provenance_markdown(meta['provenance']) + '\n'
        f"Device: {meta['device']}. Batch {meta['batch_size']} at {IMAGE_SIZE}x{IMAGE_SIZE} "
        f"(detection: {meta['det_batch_size']} at {meta['det_image_size'][1]}x"
        f"{meta['det_image_size'][0]}), random "
        'weights, synthetic data.\n\n'
        'One step = forward, backward, SGD (momentum) step, zero_grad. *saved*: bytes autograd '
        'keeps for backward during the forward pass, each storage once, parameters excluded. '
        f'*peak*: peak of the step ({peak_source}). *activation peak*: {activation}. '
        f"*step*: median of {meta['timed_rounds']} timed round(s) after the measured steps; its "
        'ratio is the median of per-round ratios, baseline and variants alternated in one '
        'process.\n\n' + compiled + table
        + (f'\nSkipped (the variant failed on this model):\n{skipped}' if skipped else ''))


def write_results(results: SuiteResults, settings: SuiteSettings, out: Path,
                  curve: bool = False, frontier: bool = False) -> str:
    """Write ``benchmark.md``, ``benchmark.json`` and ``benchmark.png`` into ``out``, with
    ``curve`` also ``checkpoint_curve.png``, and ``budget_curve.png`` when memory-budget
    variants ran; with ``frontier``, each model's frontier (:mod:`.frontier`) in the table,
    the JSON (``meta['frontier']``) and ``frontier.png``; return the markdown table."""
    table = markdown_table(results.measurements, BASELINE)
    meta = {
        'provenance': provenance(),
        'device': settings.device.type,
        'batch_size': settings.batch_size,
        'det_batch_size': settings.det_batch_size,
        'image_size': IMAGE_SIZE,
        'det_image_size': settings.det_image_size,
        'timed_rounds': settings.steps,
        'seed': settings.seed,
        'graph_breaks': results.graph_breaks if settings.compile else None,
        'compiled_variant_graph_breaks': None if settings.compile else results.graph_breaks,
        'compile_mode': settings.compile_mode,
        'skipped': results.skipped,
        'micro_batch_decisions': {key: dict(dataclasses.asdict(decision), text=str(decision))
                                  for key, decision in results.split_decisions.items()},
        'budget_decisions': {key: outcome.to_json()
                             for key, outcome in results.budget_outcomes.items()},
    }
    checks = check_against_grid(compare(results.measurements, BASELINE),
                                meta['budget_decisions'])
    if any(check.grid_fitting for check in checks):
        meta['grid_checks'] = [dict(dataclasses.asdict(check), time_vs_grid=check.time_vs_grid)
                               for check in checks]
        table += ('\nThe planner beside the fastest grid point that fits its budget (measured '
                  'step peak; times as ratios to the baseline):\n\n' + grid_markdown(checks))
    if frontier:
        kinds = {name: (variant.precision, variant.simple)
                 for name, variant in catalogue().items()}
        placed = {model: place(points) for model, points in frontier_points(
            compare(results.measurements, BASELINE), kinds, meta['budget_decisions']).items()}
        meta['frontier'] = {model: [p.to_json() for p in rows] for model, rows in placed.items()}
        table += frontier_section(placed)
        plot_frontier(placed, out / 'frontier.png')
    (out / 'benchmark.md').write_text(_markdown(table, meta))
    write_json(results.measurements, out / 'benchmark.json', BASELINE, meta)
    plot_ratios(results.measurements, out / 'benchmark.png', BASELINE)
    if curve:
        plot_tradeoff(results.measurements, out / 'checkpoint_curve.png', BASELINE,
                      curve=('ckpt-plan-min', *(f'ckpt-budget-{b}' for b in CURVE_BUDGETS)))
    if results.budget_outcomes:
        plot_tradeoff(results.measurements, out / 'budget_curve.png', BASELINE,
                      curve=[name for name in BUDGET_VARIANTS if 'lossy' not in name],
                      memory='peak_ratio',
                      background=(*GRID_VARIANTS, *LOSSY_GRID_VARIANTS))
    return table
