"""Evaluate a checkpoint on the test set of a config, with mmdropit available.

Example::

    python tools/test.py configs/tiny/vit-tiny_mnist5k.py work_dirs/vit-tiny_mnist5k/epoch_8.pth
"""
from __future__ import annotations

import argparse
import os.path as osp

import mmdropit  # noqa: F401  (shims and registrations before any config is read)
from mmdropit import ConfigError
from mmdropit.cli.checkpoint_files import check_checkpoint, check_matches
from mmdropit.cli.run import (add_common_arguments, build_runner, load_config,
                              run_reporting_errors)
from mmdropit.engine.runner_model import unwrap


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description='Test a checkpoint (mmdropit)')
    parser.add_argument('config', help='test config file path')
    parser.add_argument('checkpoint', help='checkpoint file')
    add_common_arguments(parser)
    return parser.parse_args(argv)


def test(args: argparse.Namespace) -> None:
    if osp.isdir(args.checkpoint):
        raise ConfigError(f'checkpoint {args.checkpoint!r} is a directory: give a checkpoint '
                          'file in it, e.g. epoch_12.pth')
    if not osp.isfile(args.checkpoint):
        raise ConfigError(f'checkpoint {args.checkpoint!r} does not exist')
    check_checkpoint(args.checkpoint, 'tools/test.py')
    cfg = load_config(args)
    cfg.load_from = args.checkpoint
    runner = build_runner(cfg)
    check_matches(args.checkpoint, unwrap(runner.model))
    runner.test()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    run_reporting_errors(lambda: test(args), args.debug)


if __name__ == '__main__':
    main()
