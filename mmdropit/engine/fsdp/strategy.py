"""FSDP2 (``fully_shard``) as an MMEngine strategy for ``FlexibleRunner``.

Example config (launched with ``bash tools/dist_train.sh CONFIG 8``)::

    custom_imports = dict(imports=['mmdropit'], allow_failed_imports=False)
    runner_type = 'FlexibleRunner'
    strategy = dict(
        type='FullyShardStrategy',
        model_wrapper=dict(dropit=dict(gamma=0.9)))  # FullyShardModelWrapper arguments
"""
from __future__ import annotations

import logging
import re
from collections.abc import Callable

import torch
from mmengine._strategy import DDPStrategy
from mmengine.device import get_device
from mmengine.dist import is_main_process
from mmengine.logging import print_log
from mmengine.model import is_model_wrapper
from mmengine.registry import MODEL_WRAPPERS, STRATEGIES
from torch import nn
from torch.distributed.checkpoint.state_dict import (StateDictOptions, get_model_state_dict,
                                                     set_model_state_dict)

from .full_state import gather_optimizer_state, shard_optimizer_state
from .fully_shard_wrapper import FullyShardModelWrapper
from .launch import require_process_group

FULL = StateDictOptions(full_state_dict=True, cpu_offload=True)


@STRATEGIES.register_module()
class FullyShardStrategy(DDPStrategy):
    """Train with FSDP2 under ``FlexibleRunner``; checkpoints hold full, plain state dicts.

    The model is built, initialised (``init_weights``, synchronised from rank 0) and then
    wrapped by :class:`FullyShardModelWrapper` (or ``model_wrapper['type']``). Checkpoints are
    those of a non-sharded run: ``state_dict`` gathered with
    ``get_model_state_dict(full_state_dict=True, cpu_offload=True)`` and the optimizer state
    gathered per parameter index; every rank takes part, rank 0 writes. Loading cuts the full
    state back into shards (``set_model_state_dict``), so a DDP or single-GPU checkpoint
    resumes here, and an FSDP2 checkpoint loads anywhere.

    Args:
        model_wrapper: Arguments of :class:`FullyShardModelWrapper` (``shard_policy``,
            ``dropit``, ``reshard_after_forward``, ``mixed_precision``, ``cpu_offload``),
            optionally ``type``.
        sync_bn: As in ``DDPStrategy`` (``'torch'`` or ``'mmcv'``).
        **kwargs: Passed to ``DDPStrategy`` (``work_dir``, ``env_kwargs``, ...).
    """

    def __init__(self, *, model_wrapper: dict | None = None, **kwargs) -> None:
        super().__init__(model_wrapper=model_wrapper, **kwargs)
        self._gathered: tuple[dict, dict | None] | None = None

    def _wrap_model(self, model: nn.Module) -> nn.Module:
        require_process_group(type(self).__name__)
        if is_model_wrapper(model):
            return model
        cfg = dict(type=FullyShardModelWrapper, **(self.model_wrapper or {}))
        model = self.convert_model(model.to(get_device()))
        return MODEL_WRAPPERS.build(
            cfg, default_args=dict(module=model, full_state_dict_hooks=False))

    def model_state_dict(self) -> dict:
        """The full model state dict on rank 0 (empty elsewhere); a collective."""
        if self._gathered is not None:
            return self._gathered[0]
        return get_model_state_dict(self.model.module, options=FULL)

    def optim_state_dict(self) -> dict:
        """The full optimizer state, keyed by parameter index; a collective."""
        if self._gathered is not None:
            return self._gathered[1]
        return {**self.optim_wrapper.state_dict(),
                **gather_optimizer_state(self.optim_wrapper.optimizer)}

    def load_model_state_dict(self, state_dict: dict, *, strict: bool = False,
                              revise_keys: list = [(r'^module.', '')]) -> None:  # noqa: B006
        """Load a full state dict (as saved by any strategy) into the shards; not ``strict``,
        weights of other shapes than the model's (a head for other classes) are left out with
        a warning, as MMEngine's loader does (torch's raises)."""
        for pattern, replacement in revise_keys:
            state_dict = {re.sub(pattern, replacement, k): v for k, v in state_dict.items()}
        if not strict:
            shapes = {key: tuple(value.shape)
                      for key, value in self.model.module.state_dict().items()}
            other = [key for key, value in state_dict.items() if key in shapes and
                     isinstance(value, torch.Tensor) and tuple(value.shape) != shapes[key]]
            if other:
                print_log(f'load_from: {len(other)} weight(s) of other shapes than the model\'s '
                          f'are left out ({", ".join(other[:3])}'
                          f'{" ..." if len(other) > 3 else ""})', logger='current',
                          level=logging.WARNING)
                state_dict = {key: value for key, value in state_dict.items() if key not in other}
        set_model_state_dict(self.model.module, state_dict,
                             options=StateDictOptions(full_state_dict=True, strict=strict))

    def load_optim_state_dict(self, state_dict: dict) -> None:
        """Load a full, index-keyed optimizer state into the shards."""
        self.optim_wrapper.load_state_dict(
            shard_optimizer_state(self.optim_wrapper.optimizer, state_dict))

    def save_checkpoint(self, filename: str, *, save_optimizer: bool = True,
                        save_param_scheduler: bool = True, extra_ckpt: dict | None = None,
                        callback: Callable | None = None) -> None:
        """Gather the full state on every rank, then write it from rank 0."""
        optimizer = (self.optim_state_dict() if save_optimizer and hasattr(self, 'optim_wrapper')
                     else None)
        self._gathered = (self.model_state_dict(), optimizer)
        try:
            if is_main_process():
                super(DDPStrategy, self).save_checkpoint(
                    filename, save_optimizer=save_optimizer,
                    save_param_scheduler=save_param_scheduler, extra_ckpt=extra_ckpt,
                    callback=callback)
        finally:
            self._gathered = None
