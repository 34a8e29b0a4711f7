"""What ``tools/train.py`` and ``tools/test.py`` share: common flags, config loading, errors."""
from __future__ import annotations

import argparse
import os
import os.path as osp
import sys
from collections.abc import Callable

from mmengine.config import Config, DictAction
from mmengine.utils import import_modules_from_strings

from ..common.process_exit import end_distributed_process, end_with_launcher
from ..errors import ConfigError
from .checkpoint_files import check_checkpoint
from .environment import mmcv_ops_installed, needs_mmcv_ops, require_mmcv_ops
from .friendly_errors import explain


class _ConfigOptions(DictAction):
    """MMEngine's ``DictAction`` with a usage error, not a traceback, for an item without
    ``=``."""

    def __call__(self, parser, namespace, values, option_string=None):
        malformed = [value for value in values if '=' not in value]
        if malformed:
            parser.error(f'{option_string} takes key=value items (e.g. '
                         f'train_cfg.max_epochs=2), got {" ".join(malformed)!r}')
        super().__call__(parser, namespace, values, option_string)


def add_common_arguments(parser: argparse.ArgumentParser) -> None:
    """``--work-dir``, ``--cfg-options``, ``--launcher``, ``--local-rank``, ``--debug``."""
    parser.add_argument('--work-dir', help='the dir to save logs, checkpoints and metrics')
    parser.add_argument('--cfg-options', nargs='+', action=_ConfigOptions,
                        help='override config keys, e.g. train_cfg.max_epochs=2')
    parser.add_argument('--launcher', choices=['none', 'pytorch', 'slurm', 'mpi'],
                        default='none', help='job launcher')
    parser.add_argument('--local_rank', '--local-rank', type=int, default=0)
    parser.add_argument('--debug', action='store_true', help='show full tracebacks')


def load_config(args: argparse.Namespace) -> Config:
    """Read ``args.config`` and apply the common flags.

    The work dir is ``--work-dir``, else ``cfg.work_dir``, else ``./work_dirs/<config name>``.

    Raises:
        ConfigError: the config file, or a ``_base_`` it names, does not exist, it is not a
            config or does not parse, an override gives text where the config holds a number
            or a flag or sets a
            ``data_root`` the datasets do not read, ``load_from`` is not a whole checkpoint,
            ``train_cfg.val_interval`` is below 1, the work dir is a file, or
            ``--launcher pytorch`` runs outside torchrun.
        SystemExit: ``--launcher pytorch`` and torchrun has already ended. Under torchrun, this
            process ends (SIGTERM) when torchrun does.
        EnvironmentProblem: mmcv's compiled ops do not load, and the config builds
            MMDetection's models or the ops are installed (MMEngine loads them then).
    """
    os.environ.setdefault('LOCAL_RANK', str(args.local_rank))
    if not osp.isfile(args.config):
        raise ConfigError(f'config file {args.config!r} does not exist')
    if not args.config.endswith(('.py', '.json', '.yaml', '.yml')):
        raise ConfigError(f'config file {args.config!r} is not a .py, .json or .yaml file')
    if args.launcher == 'pytorch':
        if 'RANK' not in os.environ:
            raise ConfigError('--launcher pytorch is for processes that torchrun starts: run '
                              'bash tools/dist_train.sh CONFIG NPROC')
        end_with_launcher()  # a kill -9 of torchrun would leave the ranks training on
    try:  # its imports come after the check: a broken mmcv would fail deep inside mmdet
        cfg = Config.fromfile(args.config, import_custom_modules=False)
    except SyntaxError as exc:
        raise ConfigError(_syntax_error(exc, args.config)) from exc
    except FileNotFoundError as exc:  # the config itself exists: a file it includes does not
        raise ConfigError(f'{args.config} (or a config it includes) names a file that does not '
                          f'exist: {osp.normpath(exc.filename or "?")} -- a _base_ path is '
                          'relative to the config that names it') from exc
    if needs_mmcv_ops(cfg) or mmcv_ops_installed():
        require_mmcv_ops()
    if cfg.get('custom_imports'):
        import_modules_from_strings(**cfg.custom_imports)
    cfg.launcher = args.launcher
    if args.cfg_options is not None:
        _check_option_types(cfg, args.cfg_options)
        _check_data_root_override(cfg, args.cfg_options)
        cfg.merge_from_dict(args.cfg_options)
    if cfg.get('load_from'):
        check_checkpoint(cfg.load_from, 'load_from')
    if args.work_dir is not None:
        if not args.work_dir.strip():
            raise ConfigError('--work-dir is empty: give a directory, or leave the option out '
                              'for ./work_dirs/<config name>')
        cfg.work_dir = args.work_dir
    elif cfg.get('work_dir') is None:
        cfg.work_dir = osp.join('./work_dirs', osp.splitext(osp.basename(args.config))[0])
    val_interval = (cfg.get('train_cfg') or {}).get('val_interval', 1)
    if not isinstance(val_interval, int) or val_interval < 1:
        raise ConfigError(f'train_cfg.val_interval must be an int >= 1, got {val_interval!r} '
                          '(a large one validates rarely)')
    if osp.exists(cfg.work_dir) and not osp.isdir(cfg.work_dir):
        raise ConfigError(f'work dir {cfg.work_dir} is a file: give a directory (--work-dir)')
    return cfg


def _check_option_types(cfg: Config, options: dict) -> None:
    """Refuse an override that gives text where the config holds a number or a flag (it would
    fail deep inside a training loop)."""
    for key, value in options.items():
        held: object = cfg
        for part in key.split('.'):
            held = held.get(part) if isinstance(held, (Config, dict)) else None
        if isinstance(held, (bool, int, float)) and isinstance(value, str):
            kind = {bool: 'True or False', int: 'an integer', float: 'a number'}[type(held)]
            raise ConfigError(f'--cfg-options {key}={value}: the config holds {held!r} there; '
                              f'give {kind}')


def _check_data_root_override(cfg: Config, options: dict) -> None:
    """Refuse ``--cfg-options data_root=...`` where the datasets copied the config's
    ``data_root`` when the file was read: the override would change nothing they read."""
    if 'data_root' not in options or 'data_root' not in cfg:
        return
    keys = []
    for split in ('train', 'val', 'test'):
        key, dataset = f'{split}_dataloader.dataset', cfg.get(f'{split}_dataloader', {})
        dataset = dataset.get('dataset') if isinstance(dataset, dict) else None
        while isinstance(dataset, dict):  # wrappers (RepeatDataset, ...) hold the real one
            if dataset.get('data_root') == cfg.data_root:
                keys.append(f'{key}.data_root')
            key, dataset = f'{key}.dataset', dataset.get('dataset')
    if keys:
        value = options['data_root']
        raise ConfigError('--cfg-options data_root=... does not reach the datasets (they took '
                          'data_root when the config was read): set '
                          + ' '.join(f'{key}={value}' for key in keys))


def _syntax_error(exc: SyntaxError, config: str) -> str:
    """One line naming the config file (the top one or a ``_base_``) and the line that does not
    parse: mmengine parses the text without its file name, which the traceback's frames hold
    (the innermost file being read is the one)."""
    path = exc.filename if exc.filename and not exc.filename.startswith('<') else None
    if path is None:
        read, frame = [], exc.__traceback__
        while frame is not None:
            read.append(frame.tb_frame.f_locals.get('filename'))
            frame = frame.tb_next
        files = [name for name in read if isinstance(name, str) and osp.isfile(name)]
        path = osp.normpath(files[-1]) if files else config
    return f'syntax error in config file {path}' + \
        (f', line {exc.lineno}' if exc.lineno else '') + f': {exc.msg}'


def build_runner(cfg: Config):
    """MMEngine's ``Runner``, or the ``runner_type`` the config names (e.g. FlexibleRunner).

    Raises:
        ConfigError: The optimizer type is in no registry.
        DistributedLaunchError: The config asks for FSDP but the run was not launched
            distributed (MMEngine would train unsharded without a word).
    """
    from mmengine.registry import RUNNERS
    from mmengine.runner import Runner

    from ..engine.fsdp import check_launch

    check_launch(cfg)
    _check_optimizer_type(cfg)
    if 'runner_type' in cfg:
        return RUNNERS.build(cfg)
    return Runner.from_cfg(cfg)


def _check_optimizer_type(cfg: Config) -> None:
    """Refuse an optimizer type no registry knows (MMEngine's constructor fails on it with
    ``TypeError: None is not a callable object``)."""
    from mmengine.registry import OPTIMIZERS, DefaultScope

    optim_wrapper = cfg.get('optim_wrapper')
    optimizer = optim_wrapper.get('optimizer') if isinstance(optim_wrapper, dict) else None
    name = optimizer.get('type') if isinstance(optimizer, dict) else None
    if not isinstance(name, str):
        return
    with DefaultScope.overwrite_default_scope(cfg.get('default_scope')):
        known = OPTIMIZERS.get(name) is not None
    if not known:
        raise ConfigError(f'unknown optimizer type {name!r} in optim_wrapper.optimizer: use a '
                          "torch.optim name such as 'AdamW' or 'SGD', or add the module that "
                          'registers it to custom_imports')


def run_reporting_errors(action: Callable[[], object], debug: bool) -> None:
    """Run ``action``; a known user error exits with one ``error: ...`` line.

    Unknown errors, and every error with ``debug``, keep their full traceback. A process of a
    distributed run ends through :func:`~mmdropit.common.process_exit.end_distributed_process`
    (the process group destroyed, no interpreter finalization): left to a normal exit, a gloo
    thread made a rank abort now and then ("terminate called without an active exception")
    after a successful run.
    """
    try:
        action()
    except KeyboardInterrupt:
        if debug:
            raise
        _end('interrupted (checkpoints are written whole or not at all): continue a training '
             'with the same command and --resume', 130)
    except Exception as exc:
        message = explain(exc)
        if message is None or debug:
            raise
        _end(f'error: {message}', 1)
    if _distributed():
        end_distributed_process(0)


def _end(line: str, code: int) -> None:
    """Print ``line`` and end the process with ``code`` (a distributed one as
    :func:`run_reporting_errors` says)."""
    if _distributed():
        print(line, file=sys.stderr)
        end_distributed_process(code)
    print(line, file=sys.stderr)
    sys.exit(code)


def _distributed() -> bool:
    import torch.distributed as dist

    return dist.is_available() and dist.is_initialized()
