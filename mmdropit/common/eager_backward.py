"""Autograd Functions whose backward dynamo never compiles as a frame of its own.

When autograd runs a Python Function's ``backward`` eagerly (the Function's forward ran outside
a compiled graph: a graph break, a checkpoint region dynamo could not trace) while dynamo's
frame callback is active (``loss.backward()`` called from a compiled function, as MMEngine's
compiled ``train_step`` does), dynamo compiles that ``backward`` as a frame of its own. That
frame gains nothing, costs a compilation per layout, and inside a non-reentrant checkpoint it
fails: its guard on ``ctx.saved_tensors`` unpacks the saved tensors a second time, which the
checkpoint refuses (``CheckpointError: Unpack is being triggered for a tensor that was already
unpacked once``). :func:`eager_backward` marks the ``backward`` code, and all it calls (a
checkpoint's recomputation that it sets off included), to run as it is when entered as a frame.
Dynamo still traces the Function whole, ``backward`` included, where the Function is applied
inside a graph it captures: tracing inlines the code, it does not enter it as a frame.

Example:
    >>> @eager_backward
    ... class Double(torch.autograd.Function):
    ...     @staticmethod
    ...     def forward(ctx, x):
    ...         return 2 * x
    ...     @staticmethod
    ...     def backward(ctx, grad):
    ...         return 2 * grad
    >>> x = torch.ones(2, requires_grad=True)
    >>> Double.apply(x).sum().backward(); x.grad
    tensor([2., 2.])
"""
from __future__ import annotations

from typing import TypeVar

import torch
from torch._dynamo.eval_frame import set_code_exec_strategy
from torch._dynamo.types import FrameAction, FrameExecStrategy

_F = TypeVar('_F', bound=type[torch.autograd.Function])

_RUN_AS_IT_IS = FrameExecStrategy(FrameAction.SKIP, FrameAction.SKIP)
"""Skip the frame and every frame it calls (dynamo's callback is not run for them)."""


def eager_backward(function: _F) -> _F:
    """Class decorator: ``function.backward``, and what it calls, run as they are when autograd
    calls them as frames (see the module docstring); returns ``function``."""
    set_code_exec_strategy(function.backward.__code__, _RUN_AS_IT_IS)
    return function
