"""Train a model from an MMEngine / MMDetection config, with mmdropit available.

Examples::

    python tools/train.py configs/tiny/vit-tiny_mnist5k.py
    python tools/train.py CONFIG --work-dir work_dirs/run1 --cfg-options train_cfg.max_epochs=2
    python tools/train.py CONFIG --resume            # latest checkpoint of the work dir
    bash tools/dist_train.sh CONFIG 8                 # torchrun, one process per GPU
"""
from __future__ import annotations

import argparse

import mmdropit  # noqa: F401  (shims and registrations before any config is read)
from mmdropit.cli.run import (add_common_arguments, build_runner, load_config,
                                 run_reporting_errors)
from mmdropit.cli.train_options import enable_amp, enable_auto_scale_lr, set_resume


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Train a model (mmdropit)')
    parser.add_argument('config', help='train config file path')
    parser.add_argument('--amp', action='store_true',
                        help='automatic mixed precision (keeps a custom optim wrapper type)')
    parser.add_argument('--auto-scale-lr', action='store_true',
                        help='scale the lr by real batch size / auto_scale_lr.base_batch_size')
    parser.add_argument('--resume', nargs='?', type=str, const='auto',
                        help='resume from CKPT, or from the latest checkpoint of the work '
                        'dir when CKPT is not given')
    add_common_arguments(parser)
    return parser.parse_args(argv)


def train(args: argparse.Namespace) -> None:
    cfg = load_config(args)
    if args.amp:
        enable_amp(cfg)
    if args.auto_scale_lr:
        enable_auto_scale_lr(cfg)
    set_resume(cfg, args.resume)
    build_runner(cfg).train()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    run_reporting_errors(lambda: train(args), args.debug)


if __name__ == '__main__':
    main()
