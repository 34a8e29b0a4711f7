"""Micro-batching for MMEngine optim wrappers: split each loaded batch inside ``train_step``.

The data pipeline, learning rate and effective batch stay as configured: each loaded batch is
split into micro-batches, each runs forward and backward with its loss weighted by its share of
the batch, gradients accumulate (under DDP / FSDP without synchronising until the last one), and
the optimizer steps once. MMEngine's ``accumulative_counts`` (accumulation *across* loaded
batches) keeps working on top.

:class:`MicroBatching` is a mixin for optim wrappers; when the runner initialises the wrapper's
counters (``initialize_count_status``, called by ``Runner.train`` and by every
``FlexibleRunner`` strategy), it puts a :class:`MicroBatchTrainStep` in front of the model's
``train_step``. The number of micro-batches is fixed (``micro_batches=4``) or chosen on the first
iteration from measured peaks (``memory_budget='6GB'`` or ``0.5``); the choice is logged, and
models with BatchNorm layers in training mode get a warning naming them.
"""
from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from typing import Callable

import torch
from mmengine.dist import all_reduce, get_world_size
from mmengine.logging import MMLogger, print_log
from torch import nn

from ...common.budget import Budget
from ...common.parameters import is_sharded, optimizer_params
from ...microbatch import MicroBatchConfig, SplitDecision, micro_batch_sizes, search_split
from ...microbatch.split import OUT_OF_MEMORY
from ..runner_model import unwrap
from .batch_split import (batch_size_of, first_samples, largest_first, merge_log_vars,
                          split_batch)

_LOST_WINDOW = 'the gradient of some iterations is lost'


@contextlib.contextmanager
def _without_record(logger: logging.Logger, text: str) -> Iterator[None]:
    """Drop the records of ``logger`` that contain ``text`` inside the block."""
    def keep(record: logging.LogRecord) -> bool:
        return text not in record.getMessage()

    logger.addFilter(keep)
    try:
        yield
    finally:
        logger.removeFilter(keep)


class MicroBatching:
    """Mixin for an ``OptimWrapper`` subclass: split every loaded batch into micro-batches.

    Put it first among the bases (``class W(MicroBatching, OptimWrapper)``) and call
    :meth:`configure_micro_batching` from ``__init__``. While a micro-batch that is not the last
    of its batch runs (or a trial pass of the memory search), the wrapper neither synchronises
    gradients, nor steps, nor counts an iteration; each loss is weighted by its micro-batch's
    share of the batch.
    """

    micro_batch_config: MicroBatchConfig
    split_decision: SplitDecision | None

    def configure_micro_batching(self, config: MicroBatchConfig) -> None:
        """Split batches as ``config`` says (a fixed number of micro-batches, a memory budget,
        or neither: off)."""
        self.micro_batch_config = config
        self.split_decision = None
        self._window_restored = False
        self._partial_pass = False
        self._loss_weight = 1.0

    @property
    def micro_batches(self) -> int | None:
        """The configured number of micro-batches (``None``: searched, or off)."""
        return self.micro_batch_config.micro_batches

    @property
    def memory_budget(self) -> Budget:
        """The configured memory budget of the search (``None``: a fixed number, or off)."""
        return self.micro_batch_config.memory_budget

    @property
    def micro_batching(self) -> bool:
        """Whether batches are split (a number or a budget was configured)."""
        return self.micro_batch_config.enabled

    @contextlib.contextmanager
    def micro_batch(self, weight: float, last: bool) -> Iterator[None]:
        """Run one micro-batch (``last=False``: no sync, no step, no iteration counted) whose
        loss is multiplied by ``weight``."""
        self._partial_pass, self._loss_weight = not last, weight
        try:
            yield
        finally:
            self._partial_pass, self._loss_weight = False, 1.0

    def should_update(self) -> bool:
        return not self._partial_pass and super().should_update()

    def should_sync(self) -> bool:
        return not self._partial_pass and super().should_sync()

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        return super().scale_loss(loss) * self._loss_weight

    def backward(self, loss: torch.Tensor, **kwargs) -> None:
        super().backward(loss, **kwargs)
        if self._partial_pass:
            self._inner_count -= 1  # one loaded batch is one iteration, however it is split

    def state_dict(self) -> dict:
        """The wrapper's state; in the middle of an accumulation window (``accumulative_counts``)
        of a single-process run it also holds the gradients accumulated so far, so that a
        resumed run continues the window exactly instead of losing it. Not in a run of several
        processes: until the window's last iteration each holds its own gradients (DDP's
        ``no_sync``; FSDP2's unsharded ones), and the checkpoint is written by one."""
        state = super().state_dict()
        if self.should_update():  # no gradient is waiting for the window's last iteration
            return state
        params = optimizer_params(self.optimizer)
        if get_world_size() > 1:
            print_log('the gradients of the unfinished accumulation window are each '
                      "process's own and are not saved; a run resumed from this checkpoint "
                      'starts the window afresh', logger='current', level=logging.WARNING)
            return state
        state['accumulated_gradients'] = [
            None if param.grad is None else param.grad.detach().cpu().clone() for param in params]
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        gradients = state_dict.pop('accumulated_gradients', None)
        super().load_state_dict(state_dict)
        if gradients is None:
            return
        params = optimizer_params(self.optimizer)
        if get_world_size() > 1 or is_sharded(params):
            print_log("the checkpoint's accumulated gradients are one process's: in a run of "
                      'several processes the accumulation window starts afresh',
                      logger='current', level=logging.WARNING)
            return
        if len(gradients) != len(params) or any(
                grad is not None and grad.shape != param.shape
                for param, grad in zip(params, gradients)):
            print_log('the checkpoint\'s accumulated gradients do not fit these parameters (a '
                      'different sharding?): the accumulation window starts afresh',
                      logger='current', level=logging.WARNING)
            return
        for param, grad in zip(params, gradients):
            param.grad = None if grad is None else grad.to(param.device, param.dtype)
        self._window_restored = True

    def initialize_count_status(self, model: nn.Module, init_counts: int,
                                max_counts: int) -> None:
        """MMEngine's counters; when the checkpoint's accumulated gradients were restored, its
        warning that a resumed window loses gradients is replaced by a line saying the window
        goes on."""
        if not self._window_restored:
            super().initialize_count_status(model, init_counts, max_counts)
        else:
            with _without_record(MMLogger.get_current_instance(), _LOST_WINDOW):
                super().initialize_count_status(model, init_counts, max_counts)
            print_log(f'the accumulation window continues with the checkpoint\'s gradients '
                      f'({init_counts % self._accumulative_counts} of '
                      f'{self._accumulative_counts} iterations done)', logger='current')
        if self.micro_batching:
            self.split_train_step(model)

    def split_train_step(self, model: nn.Module) -> None:
        """Put a :class:`MicroBatchTrainStep` in front of ``model.train_step`` (once). The
        runner's counters call it; a hook that makes a wrapper micro-batching after that
        (``FlexibleRunner`` prepares its strategy before ``before_run``) calls it itself."""
        if not isinstance(model.__dict__.get('train_step'), MicroBatchTrainStep):
            model.train_step = MicroBatchTrainStep(model, model.train_step, self)


class MicroBatchTrainStep:
    """Stands in front of a model's ``train_step`` and runs it once per micro-batch.

    Args:
        model: The model as the runner holds it (possibly DDP / FSDP wrapped).
        train_step: The model's own ``train_step``.
        wrapper: The micro-batching optim wrapper.
    """

    def __init__(self, model: nn.Module, train_step: Callable, wrapper: MicroBatching) -> None:
        self.model = model
        self.train_step = train_step
        self.wrapper = wrapper
        self._started = False
        self._clamp_logged = False

    def __call__(self, data: dict, optim_wrapper: MicroBatching) -> dict:
        batch_size = batch_size_of(data)
        micro_batches = self._micro_batches(data, batch_size)
        if micro_batches == 1:
            return self.train_step(data, optim_wrapper)
        sizes = micro_batch_sizes(batch_size, micro_batches)
        log_vars = []
        for index, part in enumerate(split_batch(data, sizes)):
            with optim_wrapper.micro_batch(sizes[index] / batch_size, index == len(sizes) - 1):
                log_vars.append(self.train_step(part, optim_wrapper))
        return merge_log_vars(log_vars, sizes)

    @torch.compiler.disable  # bookkeeping: traced, its first-batch flag would recompile
    def _micro_batches(self, data: dict, batch_size: int) -> int:
        """The configured or searched number of micro-batches; a later batch smaller than that
        (an epoch's last) is split into single samples. The first batch must be large enough;
        its split is logged, with a warning about BatchNorm layers if it is split at all."""
        wrapper = self.wrapper
        if wrapper.micro_batches is None and wrapper.split_decision is None:
            wrapper.split_decision = self._search(data, batch_size)
            print_log(f'micro-batching: {wrapper.split_decision}', logger='current')
        wanted = wrapper.micro_batches or wrapper.split_decision.micro_batches
        if not self._started:
            self._started = True
            sizes = micro_batch_sizes(batch_size, wanted)  # raises when the batch is too small
            print_log(f'micro-batching: each batch of {batch_size} samples runs as {wanted} '
                      f'micro-batch(es) of sizes {sizes}', logger='current')
            if wanted > 1:
                _warn_about_batch_norm(self.model)
        if wanted <= batch_size:
            return wanted
        if not self._clamp_logged:
            self._clamp_logged = True
            print_log(f'micro-batching: a batch of {batch_size} samples runs as {batch_size} '
                      f'micro-batches instead of {wanted}', logger='current')
        return batch_size

    def _search(self, data: dict, batch_size: int) -> SplitDecision:
        """Measure trial passes of a few micro-batch sizes on this batch (its largest images
        first: :func:`~.batch_split.largest_first`) and pick the split."""
        data = largest_first(data)
        return search_split(batch_size, lambda size: self.run_part(data, size),
                            unwrap(self.model), self.wrapper.optimizer,
                            self.wrapper.memory_budget, agree=max_over_ranks)

    def run_part(self, data: dict, size: int) -> None:
        """A trial pass: forward and backward of the first ``size`` samples of ``data``, the
        loss weighted by their share, with no gradient sync, no step and no iteration counted
        (gradients accumulate: callers restore them, see
        :func:`~mmdropit.memory.trial_peak.trial_peak`)."""
        with self.wrapper.micro_batch(size / batch_size_of(data), last=False):
            self.train_step(first_samples(data, size), self.wrapper)


def max_over_ranks(peak: int | None) -> int | None:
    """The largest peak of all processes (``None`` if any ran out of memory), so that every
    process takes the same decision."""
    value = torch.tensor([OUT_OF_MEMORY if peak is None else peak], dtype=torch.float64)
    all_reduce(value, op='max')
    largest = int(value.item())
    return None if largest >= OUT_OF_MEMORY else largest


def _warn_about_batch_norm(model: nn.Module) -> None:
    names = [name for name, module in model.named_modules()
             if isinstance(module, nn.modules.batchnorm._BatchNorm) and module.training]
    if not names:
        return
    shown = ', '.join(names[:5]) + (f' and {len(names) - 5} more' if len(names) > 5 else '')
    print_log(
        f'micro-batching: {len(names)} BatchNorm layer(s) in training mode ({shown}) compute '
        'their statistics per micro-batch, which changes results compared with the undivided '
        "batch. Freeze them (mmdet backbones: norm_eval=True, norm_cfg=dict(type='BN', "
        "requires_grad=False)), or use GroupNorm (norm_cfg=dict(type='GN', num_groups=32)); "
        "SyncBN takes its statistics over one micro-batch of every process, nearer the batch "
        "but not it.", logger='current', level=logging.WARNING)

