"""Accuracy parity: DropIT at several gammas against the baseline, over seeds, on real data.

Every (config, gamma, seed) is a full MMEngine training of the config on its own data; gamma 0
is the config without DropIT, any other gamma sets (or adds) its DropITHook. Runs go to
``--jobs`` worker processes that share the CPU cores; each run's console output goes to its
``run.log``. Writes ``parity.json`` (every run, the summary and where it ran), ``parity.md``
(the table) and ``parity.png`` (accuracy vs gamma) into ``--out``, and prints the table.

Examples:
    python tools/parity.py --suite        # tiny ViT, ResNet-18, Mask R-CNN on digits
    python tools/parity.py configs/tiny/vit-tiny_mnist5k.py --gammas 0,0.9 --seeds 0,1,2
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

from mmengine.config import DictAction
from rich.console import Console

from mmdropit.data.digit_canvas import make_digit_coco
from mmdropit.parity import ParityJob, markdown_table, plot_parity, run_job, summarize
from mmdropit.reporting import progress_bar, provenance, provenance_markdown

#: The suite of the benchmark issue: a tiny ViT and a small CNN on MNIST-5k, and a small Mask
#: R-CNN (a Faster R-CNN with a mask head: box AP and mask AP) on 128x128 digit canvases; under
#: 45 minutes on 2 CPU cores with 2 jobs. The parity Faster R-CNN
#: (configs/tiny/parity/faster-rcnn_r18-w32_fpn_2e_digits128.py) runs with an explicit config.
SUITE = (
    'configs/tiny/parity/vit-tiny_6e_mnist5k.py',
    'configs/tiny/parity/resnet18_1e_mnist5k.py',
    'configs/tiny/parity/mask-rcnn_r18-w32_fpn_2e_digits128.py',
)
#: The suite's detection set (configs/tiny/_base_/digit_coco128_detection.py).
SUITE_DIGITS = dict(out_dir='data/digit_coco128', canvas_size=(128, 128),
                    digits_per_image=(1, 3), scale_range=(1.0, 1.6))


def _numbers(text: str, kind: type) -> list:
    try:
        return [kind(item) for item in text.split(',') if item.strip()]
    except ValueError:
        raise SystemExit(f'expected comma-separated numbers, got {text!r}') from None


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('configs', nargs='*', help='configs to compare (or --suite)')
    parser.add_argument('--suite', action='store_true', help="the benchmark issue's models")
    parser.add_argument('--gammas', default='0,0.5,0.7,0.9', help='0 = baseline (no DropIT)')
    parser.add_argument('--seeds', default='0,1,2')
    parser.add_argument('--jobs', type=int, default=min(2, os.cpu_count() or 1),
                        help='runs at once; the CPU cores are shared out between them')
    parser.add_argument('--out', default='work_dirs/parity')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction, default={},
                        help='override keys of every config, e.g. train_cfg.max_epochs=1')
    args = parser.parse_args(argv)
    args.configs = [*SUITE, *args.configs] if args.suite else args.configs
    if not args.configs:
        parser.error('give configs, or --suite')
    missing = [path for path in args.configs if not Path(path).is_file()]
    if missing:
        parser.error(f'config file(s) not found: {", ".join(missing)}')
    args.gammas = _numbers(args.gammas, float)
    args.seeds = _numbers(args.seeds, int)
    bad = [gamma for gamma in args.gammas if not 0 <= gamma < 1]
    if bad or not args.gammas or not args.seeds:
        parser.error(f'--gammas take values in [0, 1) (0 = baseline), --seeds integers; '
                     f'got gammas {args.gammas}, seeds {args.seeds}')
    if args.jobs < 1:
        parser.error('--jobs must be at least 1')
    return args


def plan_jobs(args: argparse.Namespace) -> list[ParityJob]:
    """Seed by seed, so that a run cut short still has whole seeds of every config."""
    threads = max(1, (os.cpu_count() or 1) // args.jobs)
    out = Path(args.out)
    return [ParityJob(config, gamma, seed,
                      str(out / Path(config).stem / f'gamma{gamma:g}_seed{seed}'),
                      threads, dict(args.cfg_options))
            for seed in args.seeds for config in args.configs for gamma in args.gammas]


def run_all(jobs: list[ParityJob], workers: int, console: Console) -> list[dict]:
    """Run the jobs in fresh worker processes, showing a progress bar and one line per run."""
    runs = []
    context = multiprocessing.get_context('spawn')
    with progress_bar(console) as progress, ProcessPoolExecutor(
            workers, mp_context=context, max_tasks_per_child=1) as pool:
        task = progress.add_task('parity runs', total=len(jobs))
        futures = {pool.submit(run_job, job): job for job in jobs}
        for future in as_completed(futures):
            run = future.result()
            runs.append(run)
            name = f"{run['model']} gamma {run['gamma']:g} seed {run['seed']}"
            if 'error' in run:
                console.print(f"[red]{name}: failed[/red] ({run['error']}); "
                              f"log: {run['work_dir']}/run.log")
            else:
                figures = ', '.join(f'{key} {value:.1f}' for key, value in run['metrics'].items())
                console.print(f"{name}: {figures} in {run['seconds']:.0f} s")
            progress.advance(task)
    return runs


def write_results(runs: list[dict], record: dict, out: Path) -> str:
    """Write parity.json, parity.md and parity.png; return the table."""
    rows = summarize(runs)
    table = markdown_table(rows)
    failed = [run for run in runs if 'error' in run]
    (out / 'parity.json').write_text(json.dumps(
        dict(provenance=record, summary=rows, runs=runs), indent=1))
    (out / 'parity.md').write_text(
        '# Accuracy parity\n\n' + provenance_markdown(record) + '\n' + table
        + ''.join(f"\nFailed: {run['model']} gamma {run['gamma']:g} seed {run['seed']} "
                  f"({run['error']})" for run in failed))
    if rows:
        plot_parity(rows, out / 'parity.png')
    return table


def main(argv: list[str] | None = None) -> list[dict]:
    args = parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    console = Console()
    record = dict(provenance(), jobs=args.jobs)
    if args.suite:
        digits = dict(SUITE_DIGITS)
        make_digit_coco(digits.pop('out_dir'), **digits)  # reused when already there
    jobs = plan_jobs(args)
    console.print(f'{len(jobs)} runs ({len(args.configs)} configs x gammas '
                  f'{args.gammas} x seeds {args.seeds}), {args.jobs} at a time; logs in {out}')
    runs = run_all(jobs, args.jobs, console)
    table = write_results(runs, record, out)
    print(table, flush=True)
    console.print(f'wrote {out / "parity.md"}, {out / "parity.json"}, {out / "parity.png"}')
    if any('error' in run for run in runs):
        raise SystemExit('some runs failed; see their run.log')
    return runs


if __name__ == '__main__':
    main()
