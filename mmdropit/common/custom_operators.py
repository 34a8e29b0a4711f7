"""When a custom operator must be called through PyTorch's dispatcher, and when its Python body
can be called directly.

A ``torch.library.custom_op`` call costs about 100 us on this project's CPUs before its body
runs: on a small model (the demo's tiny ViT: 32 calls a step of 20-30 ms) that is a tenth of the
step. The operators exist for ``torch.compile`` (and fake tensors) to see DropIT's selection as
one opaque node; plain eager code gains nothing from them and calls their bodies instead.

Example:
    >>> through_dispatcher()  # plain eager code
    False
    >>> from torch.utils._python_dispatch import TorchDispatchMode
    >>> class Passthrough(TorchDispatchMode):
    ...     def __torch_dispatch__(self, func, types, args=(), kwargs=None):
    ...         return func(*args, **(kwargs or {}))
    >>> with Passthrough():
    ...     through_dispatcher()
    True
"""
from __future__ import annotations

from collections.abc import Callable

import torch
from torch._subclasses.fake_tensor import is_fake


def through_dispatcher() -> bool:
    """Whether custom operators must go through the dispatcher: while ``torch.compile`` traces,
    and under a dispatch mode (fake tensors, operator counters, memory trackers)."""
    return torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack() > 0


def operator_or_body(operator: Callable, body: Callable) -> Callable:
    """``operator`` (a ``torch.ops`` custom operator) where :func:`through_dispatcher` says so,
    else ``body``, the Python function it was made from."""
    return operator if through_dispatcher() else body


def traced(x: torch.Tensor) -> bool:
    """Whether ``x`` is being traced rather than computed: ``torch.compile`` tracing, or a fake
    tensor (``make_fx`` in its fake or symbolic mode, export). Operators without a fake
    implementation cannot run on it; under any other dispatch mode (a memory meter, an
    operator counter) on real tensors they can."""
    return torch.compiler.is_compiling() or is_fake(x)
