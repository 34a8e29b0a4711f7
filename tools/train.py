"""Train a model from an MMEngine / MMDetection config, with mmdropit available.

Examples::

    python tools/train.py configs/tiny/vit-tiny_mnist5k.py
    python tools/train.py CONFIG --work-dir work_dirs/run1 --cfg-options train_cfg.max_epochs=2
    python tools/train.py CONFIG --resume            # latest checkpoint of the work dir
    bash tools/dist_train.sh CONFIG 8                 # torchrun, one process per GPU
"""
from __future__ import annotations

import argparse
import os
import sys

import mmdropit  # noqa: F401  (shims and registrations before any config is read)
from mmdropit.engine.environment import require_mmcv_ops
from mmdropit.engine.friendly_errors import explain
from mmdropit.engine.train_options import (enable_amp, enable_auto_scale_lr, resolve_work_dir,
                                           set_resume)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    from mmengine.config import DictAction

    parser = argparse.ArgumentParser(description='Train a model (mmdropit)')
    parser.add_argument('config', help='train config file path')
    parser.add_argument('--work-dir', help='the dir to save logs and models')
    parser.add_argument('--amp', action='store_true',
                        help='automatic mixed precision (keeps a custom optim wrapper type)')
    parser.add_argument('--auto-scale-lr', action='store_true',
                        help='scale the lr by real batch size / auto_scale_lr.base_batch_size')
    parser.add_argument('--resume', nargs='?', type=str, const='auto',
                        help='resume from CKPT, or from the latest checkpoint of the work '
                        'dir when CKPT is not given')
    parser.add_argument('--cfg-options', nargs='+', action=DictAction,
                        help='override config keys, e.g. train_cfg.max_epochs=2')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
                        default='none', help='job launcher')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    parser.add_argument('--debug', action='store_true', help='show full tracebacks')
    args = parser.parse_args(argv)
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    return args


def build_runner(args: argparse.Namespace):
    from mmengine.config import Config
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner

    if not os.path.isfile(args.config):
        raise FileNotFoundError(f'config file {args.config!r} does not exist')
    require_mmcv_ops()
    cfg = Config.fromfile(args.config)
    cfg.launcher = args.launcher
    if args.cfg_options is not None:
        cfg.merge_from_dict(args.cfg_options)
    resolve_work_dir(cfg, args.config, args.work_dir)
    if args.amp:
        enable_amp(cfg)
    if args.auto_scale_lr:
        enable_auto_scale_lr(cfg)
    set_resume(cfg, args.resume)
    if 'runner_type' in cfg:
        return RUNNERS.build(cfg)
    return Runner.from_cfg(cfg)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        build_runner(args).train()
    except Exception as exc:  # one line for the user; --debug for the traceback
        message = explain(exc)
        if message is None or args.debug:
            raise
        sys.exit(f'error: {message}')


if __name__ == '__main__':
    main()
