"""One run of the accuracy-parity suite: a config trained at one DropIT gamma and one seed.

A run is a full MMEngine training of the config on its real data; only the DropIT gamma and
the seed change between the runs of one config. Its figures are the final validation
metrics, the first iteration's memory (:class:`~mmdropit.engine.hooks.MemoryReportHook`) and
the wall time.

Example::

    job = ParityJob('configs/tiny/vit-tiny_mnist5k.py', gamma=0.9, seed=0,
                    work_dir='work_dirs/parity/vit-tiny_mnist5k/gamma0.9_seed0')
    result = run_job(job)   # {'metrics': {'top1': 89.4}, 'memory': {...}, 'seconds': 61.0, ...}
"""
from __future__ import annotations

import dataclasses
import os
import sys
import time
import traceback
from pathlib import Path

from mmengine.config import Config

#: Validation metrics the suite reports: message-hub key -> (name, scale to points).
METRICS = {
    'val/accuracy/top1': ('top1', 1.0),
    'val/coco/bbox_mAP': ('box AP', 100.0),
    'val/coco/segm_mAP': ('mask AP', 100.0),
}

#: A MemoryReportHook interval that measures the first training iteration only.
FIRST_ITERATION_ONLY = 10**9


@dataclasses.dataclass(frozen=True)
class ParityJob:
    """What one run trains.

    Args:
        config: Path of the MMEngine config.
        gamma: DropIT gamma; ``0`` is the baseline (any DropITHook of the config removed).
        seed: The run's seed (``randomness.seed``).
        work_dir: Folder for the run's log and MMEngine files.
        threads: torch CPU threads of the run.
        cfg_options: Config keys to override first (``Config.merge_from_dict`` form).
    """
    config: str
    gamma: float
    seed: int
    work_dir: str
    threads: int = 1
    cfg_options: dict = dataclasses.field(default_factory=dict)


LOSSY_HOOKS = ('DropITHook', 'CompressActivationsHook')
"""Hooks a baseline run (gamma 0) removes: it trains exactly."""


def with_gamma(cfg: Config, gamma: float) -> Config:
    """Set the config's DropIT gamma, in place.

    A positive gamma updates the config's ``DropITHook`` (keeping its other settings, e.g.
    ``value_bits``) or adds ``DropITHook(gamma=gamma, strategy='mink')``; ``0`` is the exact
    baseline: every DropITHook and every CompressActivationsHook removed.

    Example:
        >>> cfg = Config(dict(custom_hooks=[dict(type='DropITHook', gamma=0.9, audit=True),
        ...                                 dict(type='CompressActivationsHook', bits=8)]))
        >>> with_gamma(cfg, 0.5).custom_hooks[1]
        {'type': 'DropITHook', 'gamma': 0.5, 'audit': True}
        >>> with_gamma(cfg, 0).custom_hooks
        []
    """
    if not 0 <= gamma < 1:
        raise ValueError(f'a parity gamma must be in [0, 1), 0 being the baseline; got {gamma}')
    hooks = [dict(hook) for hook in cfg.get('custom_hooks', [])]
    dropit = [hook for hook in hooks if hook['type'] == 'DropITHook']
    others = [hook for hook in hooks if hook['type'] != 'DropITHook']
    if gamma == 0:
        cfg.custom_hooks = [hook for hook in others if hook['type'] not in LOSSY_HOOKS]
    elif dropit:
        cfg.custom_hooks = others + [dict(dropit[0], gamma=gamma)]
    else:
        cfg.custom_hooks = others + [dict(type='DropITHook', gamma=gamma, strategy='mink')]
    return cfg


def job_config(job: ParityJob) -> Config:
    """The config that ``job`` trains: options, gamma, seed, work dir; no checkpoints; the
    first iteration's memory measured."""
    cfg = Config.fromfile(job.config)
    if job.cfg_options:
        cfg.merge_from_dict(job.cfg_options)
    with_gamma(cfg, job.gamma)
    cfg.custom_hooks = [hook for hook in cfg.custom_hooks if hook['type'] != 'MemoryReportHook']
    cfg.custom_hooks.append(dict(type='MemoryReportHook', interval=FIRST_ITERATION_ONLY))
    cfg.randomness = dict(seed=job.seed, deterministic=False)
    cfg.work_dir = job.work_dir
    cfg.default_hooks.checkpoint = dict(type='CheckpointHook', interval=-1, save_last=False)
    return cfg


def _send_output_to(path: Path) -> None:
    """Send this process's stdout and stderr (MMEngine's console log included) to ``path``."""
    stream = open(path, 'w')
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(stream.fileno(), 1)
    os.dup2(stream.fileno(), 2)


def run_job(job: ParityJob, quiet: bool = True) -> dict:
    """Train ``job`` and return its figures; meant for a fresh worker process.

    Args:
        job: The run.
        quiet: Send the process's console output to ``<work_dir>/run.log``.

    Returns:
        ``dataclasses.asdict(job)`` plus ``model`` (the config's stem), ``metrics`` (points),
        ``memory`` (MiB figures of the first iteration), ``seconds`` (wall time of the
        training, validation included) and, when training failed, ``error`` (the traceback's
        last line; the whole traceback is in the log).
    """
    import torch
    from mmengine.runner import Runner

    import mmdropit  # noqa: F401  (registrations in a spawned worker)
    from mmdropit.engine.hooks import MemoryReportHook

    work_dir = Path(job.work_dir)
    work_dir.mkdir(parents=True, exist_ok=True)
    if quiet:
        _send_output_to(work_dir / 'run.log')
    torch.set_num_threads(job.threads)
    result = dict(dataclasses.asdict(job), model=Path(job.config).stem)
    start = time.perf_counter()
    try:
        runner = Runner.from_cfg(job_config(job))
        runner.train()
    except Exception as error:  # a failed run is reported with the others, not fatal
        traceback.print_exc()
        return dict(result, error=f'{type(error).__name__}: {error}'.splitlines()[0])
    result['seconds'] = round(time.perf_counter() - start, 1)
    scalars = runner.message_hub.log_scalars
    result['metrics'] = {name: float(scalars[key].current()) * scale
                         for key, (name, scale) in METRICS.items() if key in scalars}
    memory = [hook.last_scalars for hook in runner.hooks if isinstance(hook, MemoryReportHook)]
    result['memory'] = memory[0] if memory else {}
    return result
