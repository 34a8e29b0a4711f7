"""Fail early, with what to do, when sharded training is started without a process group.

FSDP shards parameters *across processes*: one process has nothing to shard with. MMEngine's
``Runner`` silently ignores ``model_wrapper_cfg`` when it is not launched distributed, and
``FlexibleRunner`` fails deep inside PyTorch; both are turned into one actionable line.

Example::

    from mmdropit.engine.fsdp import check_launch
    check_launch(cfg)  # before building the runner, e.g. in tools/train.py
"""
from __future__ import annotations

from collections.abc import Mapping

import torch.distributed as dist

from ...errors import MMDropITError

SHARDING_TYPES = ('FullyShardModelWrapper', 'FSDPModelWrapper', 'MMFullyShardedDataParallel',
                  'FullyShardStrategy', 'FSDPStrategy')
"""Wrapper and strategy types that need several processes."""


class DistributedLaunchError(MMDropITError, RuntimeError):
    """Sharded training requested in a process that is not part of a process group."""


def launch_hint(what: str) -> str:
    """The message of :class:`DistributedLaunchError` for ``what`` (a wrapper or strategy)."""
    return (f'{what} shards the model across processes, but this process is not part of a '
            'distributed process group: launch with `bash tools/dist_train.sh CONFIG 2` '
            '(or `torchrun --nproc_per_node 2 tools/train.py CONFIG --launcher pytorch`)')


def require_process_group(what: str) -> None:
    """Raise :class:`DistributedLaunchError` unless ``torch.distributed`` is initialised."""
    if not (dist.is_available() and dist.is_initialized()):
        raise DistributedLaunchError(launch_hint(what))


def requested_sharding(cfg: Mapping) -> str | None:
    """The sharding wrapper / strategy type a config asks for, or ``None``."""
    for key in ('model_wrapper_cfg', 'strategy'):
        section = cfg.get(key)
        kind = section.get('type') if isinstance(section, Mapping) else None
        name = kind if isinstance(kind, str) else getattr(kind, '__name__', None)
        if name in SHARDING_TYPES:
            return name
    return None


def check_launch(cfg: Mapping) -> None:
    """Raise :class:`DistributedLaunchError` if ``cfg`` asks for sharding with ``launcher='none'``.

    Args:
        cfg: A loaded MMEngine config (``launcher`` as set by ``tools/train.py``).
    """
    kind = requested_sharding(cfg)
    if kind is not None and cfg.get('launcher', 'none') == 'none' and not dist.is_initialized():
        raise DistributedLaunchError(launch_hint(kind))


def needs_checkpoint_hook(what: str) -> str:
    """Why ``what`` (a wrapper) under the plain ``Runner`` needs ``FullyShardCheckpointHook``."""
    return (f'{what} under Runner needs custom_hooks=[dict(type=\'FullyShardCheckpointHook\')]: '
            'Runner.save_checkpoint runs on rank 0 only, and gathering the sharded state needs '
            'every rank')
