"""FSDP2 (``torch.distributed.fsdp.fully_shard``) as an MMEngine model wrapper.

Example config (plain ``Runner``, launched with ``bash tools/dist_train.sh CONFIG 8``)::

    custom_imports = dict(imports=['mmdropit'], allow_failed_imports=False)
    model_wrapper_cfg = dict(
        type='FullyShardModelWrapper',
        shard_policy=dict(classes=['Block'], names=['*.layer[1-4]']),  # the defaults
        dropit=dict(gamma=0.9),                # optional: convert to DropIT before sharding
        mixed_precision=dict(param_dtype='bfloat16', reduce_dtype='float32'))  # optional
    custom_hooks = [dict(type='FullyShardCheckpointHook')]  # full-state checkpoints
"""
from __future__ import annotations

from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import partial
from typing import Any

import torch
import torch.distributed as dist
from mmengine.optim import OptimWrapper
from mmengine.registry import MODEL_WRAPPERS
from torch import nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import (CPUOffloadPolicy, MixedPrecisionPolicy, OffloadPolicy,
                                    fully_shard)

from ...common.technique import config_from
from ...dropit import DropITConfig
from ...errors import ConfigError
from .full_state import (gather_optimizer_state, gather_tensor, shard_model_state,
                         shard_optimizer_state)
from .gathered_state import GatheredState
from .init_weights import init_and_sync
from .launch import needs_checkpoint_hook, require_process_group
from .shard_policy import ShardPolicy


def mixed_precision_policy(cfg: Mapping[str, Any] | None) -> MixedPrecisionPolicy:
    """``MixedPrecisionPolicy`` from a config dict whose dtypes may be strings (``'bfloat16'``)."""
    cfg = dict(cfg or {})
    for key in ('param_dtype', 'reduce_dtype', 'output_dtype'):
        if isinstance(cfg.get(key), str):
            cfg[key] = getattr(torch, cfg[key])
    return MixedPrecisionPolicy(**cfg)


@MODEL_WRAPPERS.register_module()
class FullyShardModelWrapper(GatheredState, nn.Module):
    """Shard a model with FSDP2 and give it MMEngine's ``train_step`` / ``val_step`` /
    ``test_step`` (routed through ``module.data_preprocessor``, as ``MMDistributedDataParallel``).

    In ``__init__`` the model is, in order: converted to DropIT (``dropit``), initialised
    (``init_weights``) and synchronised from rank 0, then ``fully_shard``-ed unit by unit
    (``shard_policy``) and at the root. Parameters become ``DTensor`` shards; frozen parameters
    (``requires_grad=False``, e.g. mmdet ``frozen_stages``) are sharded and never updated.

    Gradient accumulation: MMEngine's ``optim_context`` enters :meth:`no_sync` on iterations that
    must not synchronise; the following backward then keeps unsharded local gradients
    (``set_requires_gradient_sync(False)``), and the next ``train_step`` turns sync back on.

    Full state dicts (``full_state_dict_hooks=True``, for the plain ``Runner``): the wrapped
    module's ``state_dict()`` returns full plain tensors (a collective: call it on every rank),
    and its ``load_state_dict`` accepts full plain tensors (each rank keeps its shard), so
    ``load_from``, ``resume`` and ``Runner._init_model_weights`` work. ``Runner.save_checkpoint``
    runs on rank 0 only, so it needs :class:`FullyShardCheckpointHook`; ``train_step`` refuses to
    start without it. ``FullyShardStrategy`` builds the wrapper with the hooks off and handles
    checkpoints itself.

    Args:
        module: The model (an MMEngine ``BaseModel``).
        shard_policy: ``dict(classes=[...], names=[...])`` for :class:`ShardPolicy`.
        dropit: A :class:`~mmdropit.dropit.DropITConfig`'s arguments, applied before sharding.
        reshard_after_forward: Free the gathered parameters after each unit's forward
            (``False``: keep them until backward, less communication, more memory).
        mixed_precision: Keyword arguments of ``MixedPrecisionPolicy`` (dtypes may be strings).
        full_state_dict_hooks: Make the module's state dict full (see above).
        cpu_offload: Keep the parameter shards, their gradients and the optimizer state in
            host memory (FSDP2's ``CPUOffloadPolicy``, pinned on CUDA): each unit's shard is
            copied to the device for its forward and backward, and the optimizer steps on the
            CPU. Frees the GPU of all model state at the cost of the copies and a CPU optimizer
            step. On GPUs the process group needs a CPU backend beside NCCL (gathering a
            state dict and clipping gradients run collectives on the host shards):
            ``env_cfg = dict(dist_cfg=dict(backend='cpu:gloo,cuda:nccl'))``.

    Raises:
        ConfigError: ``cpu_offload`` on GPUs whose process group has no CPU backend.
    """

    def __init__(self, module: nn.Module, shard_policy: Mapping[str, Any] | None = None,
                 dropit: Mapping[str, Any] | None = None, reshard_after_forward: bool = True,
                 mixed_precision: Mapping[str, Any] | None = None,
                 full_state_dict_hooks: bool = True, cpu_offload: bool = False) -> None:
        require_process_group(type(self).__name__)
        super().__init__()
        if dropit is not None:
            config_from(DropITConfig, dropit, f'{type(self).__name__} dropit').apply(module)
        init_and_sync(module)
        policy = ShardPolicy(**(shard_policy or {}))
        device = next(module.parameters()).device
        if cpu_offload and device.type == 'cuda' and 'gloo' not in str(dist.get_backend()):
            raise ConfigError(f'{type(self).__name__} cpu_offload=True keeps the shards in host '
                              f'memory, which the {dist.get_backend()} process group cannot '
                              "gather: set env_cfg = dict(dist_cfg=dict(backend='cpu:gloo,"
                              "cuda:nccl'))")
        mesh = init_device_mesh(device.type, (dist.get_world_size(),))
        offload = (CPUOffloadPolicy(pin_memory=device.type == 'cuda') if cpu_offload
                   else OffloadPolicy())
        options = dict(mesh=mesh, reshard_after_forward=reshard_after_forward,
                       mp_policy=mixed_precision_policy(mixed_precision), offload_policy=offload)
        for _, unit in policy.units(module):
            fully_shard(unit, **options)
        fully_shard(module, **options)
        self.module = module
        self.full_state_dict_hooks = full_state_dict_hooks
        self.collective_saves = not full_state_dict_hooks
        self._sync_gradients = True
        if full_state_dict_hooks:
            # partial: torch marks public hooks with an attribute, which a bound method refuses
            module.register_state_dict_post_hook(partial(type(self)._full_state_dict_hook, self))
            module.register_load_state_dict_pre_hook(self._shard_state_dict_hook)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.module(*args, **kwargs)

    def train_step(self, data: dict | tuple | list,
                   optim_wrapper: OptimWrapper) -> dict[str, torch.Tensor]:
        """Preprocess, forward in ``'loss'`` mode, backward and step (``optim_wrapper``)."""
        if not self.collective_saves:
            raise ConfigError(needs_checkpoint_hook(type(self).__name__))
        self._sync_gradients = True
        with optim_wrapper.optim_context(self):
            data = self.module.data_preprocessor(data, training=True)
            losses = self._run_forward(data, mode='loss')
        self.module.set_requires_gradient_sync(self._sync_gradients)
        parsed_loss, log_vars = self.module.parse_losses(losses)
        optim_wrapper.update_params(parsed_loss)
        return log_vars

    def val_step(self, data: dict | tuple | list) -> list:
        """Preprocess and forward in ``'predict'`` mode."""
        data = self.module.data_preprocessor(data, False)
        return self._run_forward(data, mode='predict')

    def test_step(self, data: dict | tuple | list) -> list:
        """Same as :meth:`val_step`."""
        return self.val_step(data)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Skip the gradient reduce-scatter of the current ``train_step``'s backward.

        MMEngine leaves the context before ``backward`` runs, so the choice is applied when the
        forward is done and lasts until the next ``train_step``.
        """
        self._sync_gradients = False
        yield

    @staticmethod
    def full_optimizer_state(optimizer: torch.optim.Optimizer) -> dict:
        """The full optimizer state keyed by parameter index (a collective)."""
        return gather_optimizer_state(optimizer)

    @staticmethod
    def shard_checkpoint(checkpoint: dict, optimizer: torch.optim.Optimizer | None) -> None:
        """Cut a loaded checkpoint's full optimizer state into this rank's shards, in place (the
        model state is cut by the module's load hook)."""
        if 'optimizer' in checkpoint and optimizer is not None:
            checkpoint['optimizer'] = shard_optimizer_state(optimizer, checkpoint['optimizer'])

    def _run_forward(self, data: dict | tuple | list, mode: str) -> Any:
        if isinstance(data, dict):
            return self.module(**data, mode=mode)
        if isinstance(data, (list, tuple)):
            return self.module(*data, mode=mode)
        raise TypeError(f'data_preprocessor must return a dict, tuple or list, got {type(data)}')

    def _full_state_dict_hook(self, module: nn.Module, state_dict: dict, prefix: str,
                              local_metadata: dict) -> None:
        for key in [key for key in state_dict if key.startswith(prefix)]:
            if self._gathered is not None:
                state_dict[key] = self._gathered[key[len(prefix):]]
            else:
                state_dict[key] = gather_tensor(state_dict[key])

    @staticmethod
    def _shard_state_dict_hook(module: nn.Module, state_dict: dict, prefix: str,
                               *args: Any) -> None:
        shard_model_state(module, state_dict, prefix)
