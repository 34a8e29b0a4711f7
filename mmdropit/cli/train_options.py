"""What ``tools/train.py``'s flags do to a config, kept here so they can be tested.

Same meaning as MMDetection's ``tools/train.py``, except ``--amp``: MMDetection replaces any
``optim_wrapper.type`` with ``AmpOptimWrapper`` (GPU only); here a custom wrapper type is kept
and mixed precision also runs on CPUs (bfloat16).
"""
from __future__ import annotations

import os.path as osp

import torch
from mmengine.config import Config
from mmengine.optim import AmpOptimWrapper, OptimWrapper
from mmengine.registry import OPTIM_WRAPPERS, DefaultScope

from ..errors import ConfigError
from .checkpoint_files import check_checkpoint, resume_fallback
from ..engine.optim import MicroBatchOptimWrapper, MixedPrecisionOptimWrapper


def enable_amp(cfg: Config) -> None:
    """Turn on automatic mixed precision, keeping a custom optim wrapper type.

    ``OptimWrapper`` and ``MicroBatchOptimWrapper`` become ``MixedPrecisionOptimWrapper``
    (bfloat16 autocast on CPUs, float16 with dynamic loss scaling on GPUs), keeping their
    arguments; so does mmengine's ``AmpOptimWrapper`` on a machine without CUDA, where it cannot
    run. Any other subclass of ``AmpOptimWrapper`` is kept as it is; any other wrapper type is
    an error (it would silently lose its behaviour if replaced, and cannot do mixed precision
    if kept).

    Raises:
        ConfigError: no ``optim_wrapper``, a wrapper type that is not AMP-capable, or a GPU-only
            ``AmpOptimWrapper`` subclass on a machine without CUDA.
    """
    wrapper = cfg.get('optim_wrapper')
    if wrapper is None:
        raise ConfigError('--amp needs an optim_wrapper in the config')
    type_name = wrapper.get('type', 'OptimWrapper')
    wrapper_cls = type_name if isinstance(type_name, type) else _lookup_wrapper(cfg, type_name)
    cuda = torch.cuda.is_available()
    if wrapper_cls in (OptimWrapper, MicroBatchOptimWrapper) or (
            wrapper_cls is AmpOptimWrapper and not cuda):
        wrapper.type = 'MixedPrecisionOptimWrapper'
    elif not issubclass(wrapper_cls, AmpOptimWrapper):
        raise ConfigError(
            f'--amp: optim_wrapper type {wrapper_cls.__name__} is not an AmpOptimWrapper; '
            'it is kept as it is, so make it subclass AmpOptimWrapper (or '
            'MixedPrecisionOptimWrapper) or drop --amp')
    elif not cuda and not issubclass(wrapper_cls, MixedPrecisionOptimWrapper):
        raise ConfigError(
            f"--amp: no CUDA device, and {wrapper_cls.__name__} subclasses mmengine's GPU-only "
            'AmpOptimWrapper; subclass MixedPrecisionOptimWrapper instead (bfloat16 on CPUs)')
    wrapper.setdefault('loss_scale', 'dynamic')


def _lookup_wrapper(cfg: Config, type_name: str) -> type:
    with DefaultScope.overwrite_default_scope(cfg.get('default_scope')):
        wrapper_cls = OPTIM_WRAPPERS.get(type_name)
    if wrapper_cls is None:
        raise ConfigError(f'unknown optim_wrapper type {type_name!r}: check the spelling or '
                          'add the module that registers it to custom_imports')
    return wrapper_cls


def enable_auto_scale_lr(cfg: Config) -> None:
    """Scale the learning rate by (real batch size / ``auto_scale_lr.base_batch_size``).

    Raises:
        ConfigError: the config has no ``auto_scale_lr=dict(base_batch_size=...)``.
    """
    scale = cfg.get('auto_scale_lr')
    if not scale or 'base_batch_size' not in scale:
        raise ConfigError('--auto-scale-lr needs auto_scale_lr = dict(enable=False, '
                          'base_batch_size=<batch size the lr was tuned for>) in the config')
    scale.enable = True


def set_resume(cfg: Config, resume: str | None) -> None:
    """``--resume`` alone resumes from the work dir's latest checkpoint; with a path, from it.

    When ``{work_dir}/last_checkpoint`` is missing, empty or names a missing or truncated file
    (a kill while MMEngine wrote it), the latest whole checkpoint of the work dir is resumed
    instead (:func:`~.checkpoint_files.resume_fallback`), and a line says so; without one (a
    first run, too), training starts afresh as it would without ``--resume`` (the config's
    ``load_from`` kept), and the line says that. No file is removed.

    Raises:
        ConfigError: The given checkpoint does not exist, or is empty or truncated.
    """
    if resume is None:
        return
    configured = cfg.get('load_from')
    cfg.resume = True
    cfg.load_from = None if resume == 'auto' else resume
    if resume != 'auto':
        if not osp.isfile(resume):
            raise ConfigError(f'--resume {resume}: no such checkpoint file')
        check_checkpoint(resume, '--resume')
        return
    work_dir = cfg.get('work_dir')
    fallback, reason = resume_fallback(work_dir) if work_dir and osp.isdir(work_dir) else \
        (None, 'no work dir yet')
    if reason is not None:
        # resume=True with no load_from would make MMEngine read last_checkpoint after all
        cfg.resume, cfg.load_from = (True, fallback) if fallback else (False, configured)
        print(f'resume: {reason}; ' + (f'resuming from {fallback}, the latest whole checkpoint '
                                       'in the work dir' if fallback else
                                       'no whole checkpoint in the work dir: training starts '
                                       'afresh, as without --resume'), flush=True)
