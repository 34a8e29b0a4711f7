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
from mmengine.registry import HOOKS

from ...common.parameters import model_device
from ...common.units import mib
from ...offload import OffloadConfig
from ...offload.config import AppliedOffload
from ..runner_model import batch_loss, unwrap
from .summary import SummaryHook


@HOOKS.register_module()
class ActivationOffloadHook(SummaryHook):
    """Offload the saved tensors of chosen modules with
    :func:`mmdropit.offload.offload_activations`.

    Tensors are copied to pinned host memory on a side stream during the forward pass and
    prefetched back one module ahead during backward; gradients are unchanged. On CPU nothing
    moves (a line in the log says so). A module inside a checkpointed segment steps aside.
    After the first iteration one line starting ``mmdropit: ActivationOffloadHook:`` names the
    modules and, with ``'prefetch'`` on a GPU, what that iteration moved.

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
        self.config = OffloadConfig(names, share, method, where='ActivationOffloadHook')
        self._applied: AppliedOffload | None = None

    def before_run(self, runner) -> None:
        if self.config.names is not None:
            self._put_on(runner, self.config)

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        if self._applied is not None or data_batch is None:
            return
        model = unwrap(runner.model)
        chosen = [self.config.choose(model, batch_loss(
            model, data_batch, lambda: runner.optim_wrapper.optim_context(model))).names]
        broadcast_object_list(chosen, src=0)
        self._put_on(runner, OffloadConfig(chosen[0], method=self.config.method))

    def _put_on(self, runner, config: OffloadConfig) -> None:
        self._applied = config.apply(unwrap(runner.model))
        applied = self._applied_text(runner)
        runner.logger.info(applied[0].upper() + applied[1:])

    def _applied_text(self, runner) -> str:
        """What is offloaded, and whether anything moves."""
        where = model_device(unwrap(runner.model))
        return self._applied.summary + (
            '' if where.type == 'cuda' else f' (the model is on {where.type}: nothing moves)')

    def summary(self, runner) -> str | None:
        if self._applied is None:
            return None
        stats = self._applied.offload.copies.stats  # nothing moved: save_on_cpu, or no GPU
        moved = (f'; the first step moved {mib(stats.bytes_moved)} in {stats.tensors_moved} '
                 f'tensors to host memory, {stats.prefetched} prefetched back, '
                 f'{stats.fetched_on_demand} fetched when asked for' if stats.tensors_moved
                 else '')
        return self._applied_text(runner) + moved

    def after_run(self, runner) -> None:
        if self._applied is not None:
            self._applied.remove()
        self._applied = None
