"""Full-state checkpoints of an FSDP2-sharded model under MMEngine's plain ``Runner``.

``Runner.save_checkpoint`` is ``@master_only``: rank 0 alone reads ``model.state_dict()`` and
``optim_wrapper.state_dict()``, while gathering shards needs every rank. This hook wraps the
runner's ``save_checkpoint`` (that runner only) so that every rank first gathers the full model
and optimizer state, then rank 0 writes them. On load it cuts the full optimizer state into
this rank's shards (the model is handled by :class:`FullyShardModelWrapper`). Also saves
(but cannot load) :class:`FSDPModelWrapper` (FSDP1) runs, the optimizer then keyed by name.

Example config::

    model_wrapper_cfg = dict(type='FullyShardModelWrapper')
    custom_hooks = [dict(type='FullyShardCheckpointHook')]
"""
from __future__ import annotations

import functools
from collections.abc import Callable

from mmengine.hooks import Hook
from mmengine.optim import OptimWrapper
from mmengine.registry import HOOKS

from ...errors import ConfigError
from .fsdp1_wrapper import FSDPModelWrapper
from .fully_shard_wrapper import FullyShardModelWrapper
from .launch import check_launch


@HOOKS.register_module()
class FullyShardCheckpointHook(Hook):
    """Save and resume full (unsharded) checkpoints of a :class:`FullyShardModelWrapper` run
    (save only for :class:`FSDPModelWrapper`).

    The checkpoint is the one a non-sharded run writes: ``state_dict`` with plain tensors (loads
    into a plain model with ``load_state_dict(strict=True)``) and ``optimizer`` keyed by
    parameter index. Raises in ``before_run`` if the config asks for sharding but the run is not
    distributed (MMEngine would silently train unsharded), or if the model is not wrapped by
    one of those wrappers.
    """

    priority = 'VERY_HIGH'

    def __init__(self) -> None:
        self._optimizer_state: dict | None = None

    def before_run(self, runner) -> None:
        check_launch(runner.cfg)
        model = runner.model
        if not isinstance(model, (FullyShardModelWrapper, FSDPModelWrapper)):
            raise ConfigError('FullyShardCheckpointHook needs model_wrapper_cfg=dict('
                              "type='FullyShardModelWrapper') or 'FSDPModelWrapper', got "
                              f'{type(model).__name__}')
        model.collective_saves = True
        if not getattr(runner.save_checkpoint, '__mmdropit_shim__', False):
            runner.save_checkpoint = self._gather_first(runner, runner.save_checkpoint)

    def _gather_first(self, runner, save_checkpoint: Callable) -> Callable:
        @functools.wraps(save_checkpoint)
        def save_gathered(*args, **kwargs) -> None:
            with runner.model.gathered_state():
                if kwargs.get('save_optimizer', True) and isinstance(runner.optim_wrapper,
                                                                     OptimWrapper):
                    self._optimizer_state = runner.model.full_optimizer_state(
                        runner.optim_wrapper.optimizer)
                try:
                    save_checkpoint(*args, **kwargs)
                finally:
                    self._optimizer_state = None

        save_gathered.__mmdropit_shim__ = True
        return save_gathered

    def before_save_checkpoint(self, runner, checkpoint: dict) -> None:
        if self._optimizer_state is not None and 'optimizer' in checkpoint:
            checkpoint['optimizer'].update(self._optimizer_state)

    def after_load_checkpoint(self, runner, checkpoint: dict) -> None:
        optimizer = getattr(runner.optim_wrapper, 'optimizer', None)
        runner.model.shard_checkpoint(checkpoint, optimizer)
