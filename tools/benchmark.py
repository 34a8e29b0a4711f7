"""Measure the memory and time of training steps for a few models under memory-saving variants.

For every (model, variant) pair one training step (forward, backward, SGD step, zero_grad) is
measured three ways: the saved-activation bytes (``SavedTensorMeter``), the peak of the step by
category (``StepPeakMeter``: MemTracker on CPU, the allocator's counters on CUDA) and the step
time, timed alternately with the baseline of the same model in one process once those two steps
have warmed up (the ratio reported is the median of the per-round ratios). Models start from
random weights and see synthetic batches: nothing is downloaded. The default run (all models,
three timed rounds) takes about a quarter of an hour on two CPU cores. Writes ``benchmark.md``,
``benchmark.png`` and ``benchmark.json`` into ``--out`` and prints the table.

Example:
    python tools/benchmark.py --quick                         # deit_tiny + resnet50, batch 4
    python tools/benchmark.py --models deit_small,faster_rcnn --steps 5 --device cuda
    python tools/benchmark.py --micro --models deit_small --batch-size 64   # micro-batching
    python tools/benchmark.py --budget --models deit_small --batch-size 64  # one memory budget
    python tools/benchmark.py --budget --lossy-grid --models deit_small  # ... checked on grids
    python tools/benchmark.py --ogc-table --ogc-scale 8      # plans on the OGC paper's 18 models
    python tools/benchmark.py --compile-budget --models deit_small,resnet50   # vs compile's budget
    python tools/benchmark.py --frontier --models deit_small --batch-size 64  # vs simple recipe
    python tools/benchmark.py --compile reduce-overhead --device cuda --models deit_small \
        --variants bf16-autocast,dropit-mink+bf16   # compiled, replayed as CUDA graphs

The measuring is done by :mod:`mmdropit.bench`; a technique is one more variant there.
"""
from __future__ import annotations

import argparse
import os
import warnings
from pathlib import Path

import torch

from mmdropit.bench import (BASELINE, BUDGET_VARIANTS, CURVE_VARIANTS, DEFAULT_VARIANTS,
                            MICRO_VARIANTS, Measurement, SuiteSettings, catalogue, run_suite,
                            write_results)
from mmdropit.bench.selection import known_names, run_variants
from mmdropit.bench.budget_grid import GRID_MICRO_BATCHES, GRID_PLANS, LOSSY_GRID_SETTINGS
from mmdropit.bench.compile_budget import run_comparison, write_comparison
from mmdropit.bench.fsdp import FSDP_RANKS, run_fsdp
from mmdropit.bench.models import DET_IMAGE_SIZE, MODELS, parse_image_size
from mmdropit.bench.ogc_models import OGC_ROWS
from mmdropit.bench.ogc_table import run_ogc_table, write_ogc_results
from mmdropit.bench.variants import FRONTIER_MODELS

DEFAULT_OUT = 'work_dirs/benchmark'
COMPILE_MODES = ('default', 'reduce-overhead', 'max-autotune', 'max-autotune-no-cudagraphs')
QUICK_MODELS = ('deit_tiny', 'resnet50')
QUICK_BATCH_SIZE = 4
QUICK_STEPS = 1
PLOTS = ('checkpoint_curve.png', 'budget_curve.png', 'frontier.png')


def _wrote(out: Path, *names: str) -> None:
    print('wrote ' + ', '.join(str(out / name) for name in names))


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Read the command line; ``--quick`` fills in what was not given explicitly."""
    variants = catalogue()
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--models', help=f'comma list from {", ".join(MODELS)} (default: all, '
                        'or none when --config is given)')
    parser.add_argument('--config', action='append', default=[],
                        help='also measure the model of this MMEngine config on the first batch '
                        'of its train dataloader (repeatable)')
    parser.add_argument('--variants', help=f'comma list from {", ".join(variants)} (the baseline '
                        f'is always run; default: {", ".join(DEFAULT_VARIANTS)}; with '
                        '--frontier: narrows its set)')
    parser.add_argument('--curve', action='store_true',
                        help='measure the memory-vs-time curve of checkpointing instead: '
                        f'{", ".join(CURVE_VARIANTS)}; also writes checkpoint_curve.png')
    parser.add_argument('--micro', action='store_true',
                        help='measure micro-batching instead: ' + ', '.join(MICRO_VARIANTS))
    parser.add_argument('--budget', action='store_true',
                        help='measure the memory-budget planner (MemoryBudgetHook) instead, '
                        'beside each technique alone: ' + ', '.join(BUDGET_VARIANTS))
    parser.add_argument('--frontier', action='store_true', help='measure the frontier instead: '
                        'the simple recipe (bf16, per-block checkpointing, 2 / 4 micro-batches, '
                        'combined; on a GPU torch.compile) beside ours (plans, budgets exact and '
                        'lossy; on a GPU offload), as peak against time, each point marked '
                        'dominated or not; also writes frontier.png (default models: '
                        f'{",".join(FRONTIER_MODELS)})')
    shares = '/'.join(str(p) for p in GRID_PLANS if isinstance(p, float))
    parser.add_argument('--grid', action='store_true', help=f'with --budget: also measure '
                        f'every combination of {"/".join(map(str, GRID_MICRO_BATCHES))} '
                        f'micro-batches and no plan / plans at {shares} of the activation peak / '
                        'the least-memory plan, and check the planner against the fastest fit')
    parser.add_argument('--lossy-grid', action='store_true',
                        help='with --budget: --grid, and the lossy settings %s under the same '
                        'micro-batch counts with no plan / the least-memory plan (a lossy '
                        'decision is checked against both grids)' % ', '.join(LOSSY_GRID_SETTINGS))
    parser.add_argument('--fsdp', action='store_true',
                        help='measure the bytes each of %d gloo processes holds under DDP and '
                        'FSDP2 instead (parameters, gradients, AdamW state)' % FSDP_RANKS)
    parser.add_argument('--ogc-table', action='store_true',
                        help='measure our least-memory plan and our plan at the paper\'s cut on '
                        'the models of the OGC paper\'s table instead, beside its figures '
                        '(--models then names rows: %s)' % ', '.join(OGC_ROWS))
    parser.add_argument('--ogc-scale', type=int, default=8,
                        help='with --ogc-table: divide the paper\'s batch sizes by this')
    parser.add_argument('--compile-budget', action='store_true',
                        help='compare our plans (eager and compiled) with torch.compile\'s '
                        'activation_memory_budget swept from 1 to 0 instead, one process per '
                        'setting; writes compile_budget.md, .json and .png')
    parser.add_argument('--compile', nargs='?', const='default', choices=COMPILE_MODES,
                        metavar='MODE', help='compile every model (torch.compile, inductor) '
                        'before measuring, reporting graph breaks; MODE: inductor\'s mode (%s)'
                        % ', '.join(COMPILE_MODES))
    parser.add_argument('--batch-size', type=int,
                        help='images per step for the classification models (default 16)')
    parser.add_argument('--det-batch-size', type=int, default=2,
                        help='images per step for detection')
    parser.add_argument('--det-image-size', type=parse_image_size, default=DET_IMAGE_SIZE,
                        metavar='WIDTHxHEIGHT',
                        help='detection images (default %dx%d; 1333x800: mmdet\'s COCO scale)'
                        % DET_IMAGE_SIZE[::-1])
    parser.add_argument('--steps', type=int, help='timed rounds after the warm-up (default 3)')
    parser.add_argument('--out', default=DEFAULT_OUT, help='output folder')
    parser.add_argument('--device', choices=('cpu', 'cuda'),
                        default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--seed', type=int, default=0)
    parser.add_argument('--quick', action='store_true',
                        help=f'{",".join(QUICK_MODELS)} at batch {QUICK_BATCH_SIZE}, '
                             f'{QUICK_STEPS} timed round')
    args = parser.parse_args(argv)
    if args.compile_budget and args.device != 'cpu':
        raise SystemExit('--compile-budget measures CPU steps (its meter reads the CPU '
                         'allocator): add --device cpu')
    if args.device == 'cuda' and not torch.cuda.is_available():
        raise SystemExit('--device cuda: torch sees no CUDA device here; leave --device out')
    if args.ogc_scale < 1:
        raise SystemExit('--ogc-scale must be at least 1')
    missing = [path for path in args.config if not os.path.isfile(path)]
    if missing:
        raise SystemExit(f'config file(s) not found: {", ".join(missing)}')
    try:  # the names given, checked; the variants of the run chosen
        if args.ogc_table:
            args.models = known_names(args.models or ','.join(OGC_ROWS), OGC_ROWS, 'OGC table row')
        elif args.models or not args.config:
            args.models = known_names(args.models or ','.join(
                QUICK_MODELS if args.quick else FRONTIER_MODELS if args.frontier else MODELS),
                MODELS, 'model')
        else:
            args.models = []
        args.variants = run_variants(
            args.variants, budget=args.budget, grid=args.grid, lossy_grid=args.lossy_grid,
            curve=args.curve, micro=args.micro, frontier=args.frontier, device=args.device,
            compiled=args.compile is not None)
    except ValueError as error:
        raise SystemExit(str(error)) from None
    batch_size, steps = (QUICK_BATCH_SIZE, QUICK_STEPS) if args.quick else (16, 3)
    args.batch_size = batch_size if args.batch_size is None else args.batch_size
    args.steps = steps if args.steps is None else args.steps
    if args.steps < 1:
        raise SystemExit('--steps must be at least 1')
    return args


def main(argv: list[str] | None = None) -> list[Measurement] | list[dict]:
    """Run the benchmark and write ``benchmark.md``, ``benchmark.png`` and ``benchmark.json``
    (with ``--fsdp``: ``fsdp.json``, with ``--compile-budget``: ``compile_budget.*``; both
    return their rows as dicts)."""
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    if args.fsdp:
        return run_fsdp(args.models, out)
    warnings.filterwarnings('ignore', message='torch.utils.checkpoint: the use_reentrant')
    if args.compile_budget:
        compared = run_comparison(args.models, args.batch_size, args.steps, args.seed)
        print('\n' + write_comparison(compared, out, args.batch_size, args.steps), end='')
        _wrote(out, 'compile_budget.md', 'compile_budget.json', 'compile_budget.png')
        return [vars(result) for result in compared]
    if args.ogc_table:
        results = run_ogc_table(args.models, args.ogc_scale, args.steps,
                                torch.device(args.device), args.seed)
        print('\n' + write_ogc_results(results, out, args.ogc_scale, args.steps), end='')
        _wrote(out, 'ogc_table.md', 'ogc_table.json')
        return [m for result in results for m in result.measurements]
    variants = catalogue()
    chosen = [variants[BASELINE]] + [variants[name] for name in args.variants
                                     if name != BASELINE]
    settings = SuiteSettings(args.batch_size, args.det_batch_size, args.steps,
                             torch.device(args.device), args.seed, args.compile is not None,
                             None if args.compile in (None, 'default') else args.compile,
                             args.det_image_size)
    results = run_suite(args.models, args.config, chosen, settings)
    table = write_results(results, settings, out, curve=args.curve, frontier=args.frontier)
    plots = [plot for plot, run in zip(PLOTS, (args.curve, args.budget or args.frontier,
                                               args.frontier)) if run and (out / plot).is_file()]
    print(f'\n{table}')
    _wrote(out, 'benchmark.md', 'benchmark.json', 'benchmark.png', *plots)
    return results.measurements


if __name__ == '__main__':
    main()
