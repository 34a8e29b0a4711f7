"""Accuracy parity: train configs with several seeds and compare top-1 with the baseline.

Each (config, seed) pair is a full training through MMEngine's Runner on the config's real data;
the figure is the final validation top-1. Writes ``parity.md`` and ``parity.json`` into ``--out``.

Example:
    python tools/parity.py --seeds 0,1,2 \\
        configs/tiny/vit-tiny_mnist5k.py configs/tiny/vit-tiny_dropit-mink0.9_mnist5k.py
"""
from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from mmengine.config import Config
from mmengine.runner import Runner

import mmdropit  # noqa: F401  (registrations)

METRIC = 'val/accuracy/top1'


def train_once(config: str, seed: int, work_dir: Path) -> dict:
    """Train ``config`` with ``seed`` and return its final top-1 and wall time."""
    cfg = Config.fromfile(config)
    cfg.randomness = dict(seed=seed, deterministic=False)
    cfg.work_dir = str(work_dir)
    cfg.default_hooks.checkpoint = dict(type='CheckpointHook', interval=-1, save_last=False)
    start = time.perf_counter()
    runner = Runner.from_cfg(cfg)
    runner.train()
    return dict(config=Path(config).stem, seed=seed,
                top1=float(runner.message_hub.get_scalar(METRIC).current()),
                seconds=round(time.perf_counter() - start, 1))


def table(runs: list[dict]) -> str:
    """Markdown: mean and spread of top-1 per config, and the difference to the first config
    of the same family (the baseline comes first on the command line)."""
    by_config: dict[str, list[dict]] = {}
    for run in runs:
        by_config.setdefault(run['config'], []).append(run)
    lines = ['| config | seeds | top-1 per seed | mean top-1 | vs baseline | s / run |',
             '|---|---:|---|---:|---:|---:|']
    baselines: dict[str, float] = {}
    for name, group in by_config.items():
        mean = statistics.mean(run['top1'] for run in group)
        family = name.split('_')[0]
        baseline = baselines.setdefault(family, mean)
        per_seed = ', '.join(f"{run['top1']:.1f}" for run in group)
        seconds = statistics.mean(run['seconds'] for run in group)
        lines.append(f'| {name} | {len(group)} | {per_seed} | {mean:.2f} | '
                     f'{mean - baseline:+.2f} | {seconds:.0f} |')
    return '\n'.join(lines) + '\n'


def main(argv: list[str] | None = None) -> list[dict]:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('configs', nargs='+', help='configs; a family\'s baseline first')
    parser.add_argument('--seeds', default='0,1,2')
    parser.add_argument('--out', default='work_dirs/parity')
    args = parser.parse_args(argv)
    seeds = [int(seed) for seed in args.seeds.split(',')]
    missing = [path for path in args.configs if not Path(path).is_file()]
    if missing:
        raise SystemExit(f'config file(s) not found: {", ".join(missing)}')
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    runs = []
    total = len(args.configs) * len(seeds)
    for config in args.configs:
        for seed in seeds:
            print(f'[{len(runs) + 1}/{total}] {Path(config).stem} seed {seed}', flush=True)
            runs.append(train_once(config, seed, out / Path(config).stem / f'seed{seed}'))
            print(f"  top-1 {runs[-1]['top1']:.2f} in {runs[-1]['seconds']} s", flush=True)
            (out / 'parity.json').write_text(json.dumps(runs, indent=1))
    markdown = table(runs)
    (out / 'parity.md').write_text(markdown)
    print(markdown)
    return runs


if __name__ == '__main__':
    main()
