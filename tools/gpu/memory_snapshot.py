"""Record a CUDA memory snapshot of one training step per variant and render it as HTML.

Example (on a GPU machine)::

    python tools/gpu/memory_snapshot.py --model deit_small --batch-size 64 \
        --variants baseline,ckpt-plan-min --out work_dirs/snapshots

Writes ``snapshot_<model>_<variant>.pickle`` (open it at https://pytorch.org/memory_viz),
``snapshot_<model>_<variant>.html`` (the allocation timeline, from PyTorch's own renderer; it
loads its viewer from a CDN) and ``snapshot_<model>.png`` (the allocated memory of every variant's
step, one line each), after a warm-up step so the optimizer's state exists before the recorded
one.
"""
from __future__ import annotations

import argparse
import pickle
import sys
from pathlib import Path

import torch

from mmdropit.bench.harness import train_step
from mmdropit.bench.models import MODELS
from mmdropit.bench.plot import plot_allocation_timelines
from mmdropit.bench.variants import catalogue


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='CUDA memory snapshots of training steps')
    parser.add_argument('--model', default='deit_small', choices=sorted(MODELS))
    parser.add_argument('--batch-size', type=int, default=64)
    parser.add_argument('--variants', default='baseline,ckpt-plan-min',
                        help='comma list of tools/benchmark.py variants')
    parser.add_argument('--out', type=Path, default=Path('work_dirs/snapshots'))
    args = parser.parse_args(argv)
    known = catalogue()
    unknown = [name for name in args.variants.split(',') if name not in known]
    if unknown:
        parser.error(f'unknown variant(s) {", ".join(unknown)}: use names from '
                     f'{", ".join(known)}')
    return args


def snapshot(model: str, variant_name: str, batch_size: int, out: Path) -> dict:
    """Record one step of ``model`` under ``variant_name``, write its pickle and HTML files and
    return the snapshot."""
    from torch.cuda import _memory_viz

    device = torch.device('cuda')
    torch.manual_seed(0)
    work = MODELS[model](model, batch_size, device)
    variant = catalogue()[variant_name]
    optimizer = torch.optim.SGD(work.model.parameters(), lr=1e-4, momentum=0.9)
    work.optimizer = optimizer
    with variant.prepare(work):
        train_step(work, variant, optimizer)  # warm-up: the optimizer's state exists after it
        torch.cuda.synchronize()
        torch.cuda.memory._record_memory_history(max_entries=200_000)
        # torch 2.11 fails a backward that recomputes a checkpoint while the history records
        # Python stacks (SystemError, pytorch/pytorch#179536: the recomputation stops early by
        # raising, and the stack capture runs with that error set); recomputing whole segments
        # avoids it, at the price of the tail of each segment recomputed past its last use
        with torch.utils.checkpoint.set_checkpoint_early_stop(False):
            train_step(work, variant, optimizer)
        torch.cuda.synchronize()
        recorded = torch.cuda.memory._snapshot()
        torch.cuda.memory._record_memory_history(enabled=None)
    stem = out / f'snapshot_{model}_{variant_name}'
    stem.with_suffix('.pickle').write_bytes(pickle.dumps(recorded))
    stem.with_suffix('.html').write_text(_memory_viz.trace_plot(recorded))
    print(f'wrote {stem}.html, {stem}.pickle', flush=True)
    return recorded


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if not torch.cuda.is_available():
        sys.exit('error: memory snapshots need a CUDA device (this machine has none)')
    args.out.mkdir(parents=True, exist_ok=True)
    recorded = {name: snapshot(args.model, name, args.batch_size, args.out)
                for name in args.variants.split(',')}
    picture = plot_allocation_timelines(recorded, args.out / f'snapshot_{args.model}.png',
                                        f'{args.model}, batch {args.batch_size}, one step')
    print(f'wrote {picture}')


if __name__ == '__main__':
    main()
