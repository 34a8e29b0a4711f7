"""Keep what chosen modules save for backward in pinned host memory (GPU training).

Example config: the earliest blocks holding half of a step's saved bytes, chosen on the first
training batch::

    custom_imports = dict(imports=['mmdropit'], allow_failed_imports=False)
    custom_hooks = [dict(type='ActivationOffloadHook', share=0.5)]

Or named modules, with PyTorch's ``save_on_cpu`` instead of the side-stream copies::

    custom_hooks = [dict(type='ActivationOffloadHook', names=['backbone.layer1', 'backbone.layer2'],
                         method='save_on_cpu')]
"""
from __future__ import annotations

from collections.abc import Sequence

from mmengine.dist import broadcast_object_list
from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from ...common.parameters import model_device
from ...common.units import mib
from ...errors import ConfigError
from ...offload import (METHODS, block_patterns, modules_holding_share, offload_activations,
                        restore_offload)
from ..runner_model import batch_loss, unwrap


@HOOKS.register_module()
class ActivationOffloadHook(Hook):
    """Offload the saved tensors of chosen modules with
    :func:`mmdropit.offload.offload_activations`.

    Tensors are copied to pinned host memory on a side stream during the forward pass and
    prefetched back one module ahead during backward; gradients are unchanged. On CPU nothing
    moves (a line in the log says so). A module inside a checkpointed segment steps aside.

    Args:
        names: Name patterns of the modules to offload (of the unwrapped model, e.g.
            ``['backbone.layer1']``); or
        share: Offload the earliest blocks (of the model's ``nn.Sequential`` block sequences)
            holding this share of a step's saved bytes, chosen on the first training batch
            (rank 0's choice on every rank).
        method: ``'prefetch'`` (side-stream copies, prefetched) or ``'save_on_cpu'``
            (``torch.autograd.graph.save_on_cpu``, for comparison).
    """

    priority = 'VERY_HIGH'

    def __init__(self, names: Sequence[str] | None = None, share: float | None = None,
                 method: str = 'prefetch') -> None:
        if (names is None) == (share is None):
            raise ConfigError('ActivationOffloadHook takes names=[...] or share=0.5 (one of '
                              'the two)')
        if isinstance(names, str):
            raise ConfigError("ActivationOffloadHook names take a list, e.g. "
                              "names=['backbone.layer1']")
        if share is not None and (isinstance(share, bool) or not isinstance(share, (int, float))
                                  or not 0 < share <= 1):
            raise ConfigError(f'ActivationOffloadHook share must be in (0, 1], got {share!r}')
        if method not in METHODS:
            raise ConfigError(f'ActivationOffloadHook method {method!r}: use one of '
                              f'{", ".join(METHODS)}')
        self.names = None if names is None else list(names)
        self.share = share
        self.method = method
        self._offload = None
        self._reported = False

    def before_run(self, runner) -> None:
        if self.names is not None:
            self._put_on(runner, self.names)

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        if self._offload is not None or data_batch is None:
            return
        model = unwrap(runner.model)
        chosen = [modules_holding_share(model, batch_loss(
            model, data_batch, lambda: runner.optim_wrapper.optim_context(model)),
            block_patterns(model) or ['*'], self.share)]
        broadcast_object_list(chosen, src=0)
        self._put_on(runner, chosen[0])

    def _put_on(self, runner, names: Sequence[str]) -> None:
        model = unwrap(runner.model)
        self._offload = offload_activations(model, names, self.method)
        where = model_device(model)
        runner.logger.info(
            f'Activation offload ({self.method}) of {len(self._offload.names)} modules: '
            + ', '.join(self._offload.names[:6]) + (', ...' if len(self._offload.names) > 6 else '')
            + ('' if where.type == 'cuda' else f' (the model is on {where.type}: nothing moves)'))

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        if self._reported or self._offload is None or self.method != 'prefetch':
            return
        stats = self._offload.copies.stats
        runner.logger.info(f'Activation offload, first step: {mib(stats.bytes_moved)} '
                           f'in {stats.tensors_moved} tensors to host memory, '
                           f'{stats.prefetched} prefetched back, {stats.fetched_on_demand} '
                           'fetched when asked for')
        self._reported = True

    def after_run(self, runner) -> None:
        restore_offload(unwrap(runner.model))
        self._offload = None
