"""FSDP1 (``FullyShardedDataParallel``) from a plain ``Runner`` config.

MMEngine 0.10.7's ``MMFullyShardedDataParallel`` works under ``FlexibleRunner`` but crashes under
``Runner``: ``Runner._init_model_weights`` runs *after* wrapping, calls ``init_weights()`` on the
inner module and broadcasts every tensor of its ``state_dict()``. With ``use_orig_params=True``
those tensors are views of this rank's shard of each ``FlatParameter``: a parameter that lies in
another rank's shard is an empty tensor here, one cut by a shard boundary is a 1-D piece. The
broadcast sizes then differ between ranks (gloo: ``op.preamble.length <= op.nbytes. 384 vs 0``)
and, where they agree by chance, rank 0's shard would overwrite the others'.

:class:`FSDPModelWrapper` initialises the weights *before* sharding and broadcasts them from
rank 0 (FSDP's ``sync_module_states`` refuses CPU modules), and makes the inner module's
``state_dict()`` hold full tensors (gathered with ``summon_full_params``: a collective, every
rank calls it there), so the Runner's broadcast is a harmless no-op. Without CUDA it defaults
to ``device_id=torch.device('cpu')``.

``Runner.save_checkpoint`` runs on rank 0 only, so saving needs :class:`FullyShardCheckpointHook`
(every rank gathers first). Loading a checkpoint into it under ``Runner`` is refused: the inner
module's ``_load_from_state_dict`` cannot fill shard views; use ``FullyShardModelWrapper``
(FSDP2) or ``FlexibleRunner`` with MMEngine's ``FSDPStrategy`` to resume.

Example config (``bash tools/dist_train.sh CONFIG 8``)::

    model_wrapper_cfg = dict(type='FSDPModelWrapper')  # any MMFullyShardedDataParallel argument
    custom_hooks = [dict(type='FullyShardCheckpointHook')]
"""
from __future__ import annotations

import os
from functools import partial
from typing import Any

import torch
from mmengine.model.wrappers import MMFullyShardedDataParallel
from mmengine.optim import OptimWrapper
from mmengine.registry import MODEL_WRAPPERS
from torch import nn
from torch.distributed.fsdp import FullyShardedDataParallel
from torch.distributed.fsdp._common_utils import clean_tensor_name

from ...errors import ConfigError
from .gathered_state import GatheredState
from .init_weights import init_and_sync
from .launch import needs_checkpoint_hook, require_process_group


@MODEL_WRAPPERS.register_module()
class FSDPModelWrapper(GatheredState, MMFullyShardedDataParallel):
    """``MMFullyShardedDataParallel`` that trains under the plain ``Runner``.

    Frozen parameters work (``use_orig_params=True``, MMEngine's default, lets one
    ``FlatParameter`` mix frozen and trained parameters; the optimizer gets every parameter
    and skips those without gradient).

    Args:
        module: The model.
        device_id: Device of the shards; default ``LOCAL_RANK``'s GPU, or the CPU without CUDA.
        **kwargs: Arguments of ``MMFullyShardedDataParallel`` (``auto_wrap_policy``,
            ``sharding_strategy``, ``mixed_precision``, ...).
    """

    def __init__(self, module: nn.Module, device_id: int | torch.device | None = None,
                 **kwargs: Any) -> None:
        require_process_group(type(self).__name__)
        if device_id is None:
            device_id = (int(os.environ.get('LOCAL_RANK', 0)) if torch.cuda.is_available()
                         else torch.device('cpu'))
        init_and_sync(module)
        super().__init__(module, device_id=device_id, **kwargs)
        # partial: torch marks public hooks with an attribute, which a bound method refuses
        self.module.register_state_dict_post_hook(partial(type(self)._full_state_dict_hook, self))
        self._gathering = False
        self.collective_saves = False

    def train_step(self, data: dict | tuple | list, optim_wrapper: OptimWrapper) -> dict:
        """``MMFullyShardedDataParallel.train_step``, once checkpoints can be saved, with
        ``clip_grad=dict(max_norm=...)`` clipping by the norm over all shards."""
        if not self.collective_saves:
            raise ConfigError(needs_checkpoint_hook(type(self).__name__))
        if optim_wrapper.clip_grad_kwargs and \
                optim_wrapper.clip_func is torch.nn.utils.clip_grad_norm_:
            optim_wrapper.clip_func = self._clip_grad_norm
        return super().train_step(data, optim_wrapper)

    def _clip_grad_norm(self, params: list[torch.Tensor], max_norm: float,
                        norm_type: float = 2.0, **_: Any) -> torch.Tensor:
        """``clip_grad_norm_`` over every shard (each rank alone sees only its own part)."""
        return FullyShardedDataParallel.clip_grad_norm_(self, max_norm, norm_type)

    def full_optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict:
        """The full optimizer state keyed by parameter name (``FSDP.optim_state_dict``)."""
        return FullyShardedDataParallel.optim_state_dict(self, optimizer)

    def shard_checkpoint(self, checkpoint: dict, optimizer: torch.optim.Optimizer | None) -> None:
        """Refuse: see the module docstring."""
        raise ConfigError(
            'loading a checkpoint into FSDPModelWrapper under Runner is not supported (its '
            'shards are views MMEngine cannot load into): use '
            "model_wrapper_cfg=dict(type='FullyShardModelWrapper') (FSDP2), or "
            "runner_type='FlexibleRunner' with strategy=dict(type='FSDPStrategy')")

    def _full_state_dict_hook(self, module: nn.Module, state_dict: dict, prefix: str,
                              local_metadata: dict) -> None:
        if self._gathered is not None:
            state_dict.update({prefix + key: value for key, value in self._gathered.items()})
            return
        if self._gathering:
            return
        self._gathering = True
        try:
            with FullyShardedDataParallel.summon_full_params(self, writeback=False):
                full = {clean_tensor_name(name): tensor.detach().clone()
                        for name, tensor in module.state_dict(keep_vars=True).items()}
        finally:
            self._gathering = False
        for key in [key for key in state_dict if key.startswith(prefix)]:
            state_dict[key] = full[clean_tensor_name(key[len(prefix):])]
