"""The model as a runner holds it: unwrapped from DDP / FSDP, and the loss of one loaded batch.

Shared by the hooks and optim wrappers that look inside a training step (``DropITHook``'s
audit, ``CheckpointPlanHook``'s recorded step, micro-batching's trial passes).
"""
from __future__ import annotations

import contextlib
from collections.abc import Callable

import torch
from mmengine.model import is_model_wrapper
from torch import nn


def unwrap(model: nn.Module) -> nn.Module:
    """The model inside a DDP / FSDP / MMEngine wrapper (the model itself if not wrapped)."""
    return model.module if is_model_wrapper(model) else model


def compiles_model(runner) -> bool:
    """Whether ``runner`` trains its model under ``torch.compile`` (``compile=True`` or a dict
    in the config; ``Runner`` reads it from its config, ``FlexibleRunner`` keeps it)."""
    setting = getattr(runner, '_compile', None)
    if setting is None:
        setting = runner.cfg.get('compile', None)
    return bool(setting) or isinstance(setting, dict)


def loss_of(model: nn.Module, data: dict | tuple | list,
            forward_context: Callable[[], contextlib.AbstractContextManager] | None = None
            ) -> torch.Tensor:
    """The summed training loss of preprocessed ``data``, as ``BaseModel.train_step`` computes it
    (``model(..., mode='loss')``, then ``model.parse_losses``), with no backward pass.

    Args:
        model: An unwrapped MMEngine ``BaseModel``.
        data: What its data preprocessor returned (a dict of keyword arguments, or a tuple).
        forward_context: Entered around the model's forward pass only, e.g. the optim
            wrapper's ``optim_context`` (autocast under mixed precision).
    """
    with forward_context() if forward_context else contextlib.nullcontext():
        losses = model(**data, mode='loss') if isinstance(data, dict) else \
            model(*data, mode='loss')
    return model.parse_losses(losses)[0]


def batch_loss(model: nn.Module, data_batch: dict,
               forward_context: Callable[[], contextlib.AbstractContextManager] | None = None
               ) -> Callable[[], torch.Tensor]:
    """A closure that preprocesses ``data_batch`` (``training=True``) and returns its
    :func:`loss_of`: the ``step`` that planning and auditing a training step need.

    Example::

        step = batch_loss(model, data_batch, lambda: runner.optim_wrapper.optim_context(model))
        plan = mmdropit.plan_checkpoints(model, step)
    """
    return lambda: loss_of(model, model.data_preprocessor(data_batch, training=True),
                           forward_context)
