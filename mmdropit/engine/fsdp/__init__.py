"""Sharded data-parallel training (FSDP) for MMEngine runs, on GPUs or on CPUs (gloo).

- :class:`FullyShardModelWrapper` (FSDP2, ``fully_shard``) for the plain ``Runner``, with
  :class:`FullyShardCheckpointHook` for full-state checkpoints;
- :class:`FullyShardStrategy` (FSDP2) for ``FlexibleRunner``;
- :class:`FSDPModelWrapper` (FSDP1) for the plain ``Runner``: MMEngine's
  ``MMFullyShardedDataParallel`` with the fixes it needs there.

Example config (plain ``Runner``; ``bash tools/dist_train.sh CONFIG 8``)::

    custom_imports = dict(imports=['mmdropit'], allow_failed_imports=False)
    model_wrapper_cfg = dict(type='FullyShardModelWrapper', dropit=dict(gamma=0.9))
    custom_hooks = [dict(type='FullyShardCheckpointHook')]

All names are registered in MMEngine's root registries (``MODEL_WRAPPERS``, ``STRATEGIES``,
``HOOKS``), so they resolve under any ``default_scope``.
"""
from .checkpoint_hook import FullyShardCheckpointHook
from .fsdp1_wrapper import FSDPModelWrapper
from .fully_shard_wrapper import FullyShardModelWrapper
from .launch import DistributedLaunchError, check_launch, require_process_group
from .shard_policy import ShardPolicy
from .strategy import FullyShardStrategy

__all__ = ['DistributedLaunchError', 'FSDPModelWrapper', 'FullyShardCheckpointHook',
           'FullyShardModelWrapper', 'FullyShardStrategy', 'ShardPolicy', 'check_launch',
           'require_process_group']
