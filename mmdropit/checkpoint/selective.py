"""Selective recompute: a checkpoint that keeps the outputs of its costly ops.

A plain checkpoint recomputes its whole forward in backward. A *selective* one keeps, from the
forward pass, the outputs of the ops that cost the most time per byte kept (matrix products,
convolutions, fused attention) and recomputes only the cheap ops around them (normalisations,
activations, additions, reshapes). It keeps more bytes than a plain checkpoint and fewer than no
checkpoint, at a small fraction of the recompute time; the solvers weigh it as one more way of
covering a segment.

This uses PyTorch's selective activation checkpointing
(:func:`torch.utils.checkpoint.create_selective_checkpoint_contexts`) as the ``context_fn`` of a
non-reentrant checkpoint. A kept output that the forward pass later changes in place cannot be
reused; :mod:`.record` notes such outputs and no selective checkpoint covers them.

Example:
    >>> from torch.utils.checkpoint import checkpoint
    >>> linear = torch.nn.Linear(4, 4)
    >>> x = torch.randn(2, 4, requires_grad=True)
    >>> y = checkpoint(lambda t: linear(t).relu(), x, use_reentrant=False,
    ...                context_fn=selective_contexts)
    >>> y.sum().backward()  # backward recomputes the ReLU only, the matrix product is kept
    >>> is_costly(torch.ops.aten.addmm.default), is_costly(torch.ops.aten.relu.default)
    (True, False)
"""
from __future__ import annotations

import torch
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

_COSTLY_NAMES = (
    'mm', 'addmm', 'bmm', 'baddbmm', 'convolution',
    '_scaled_dot_product_flash_attention', '_scaled_dot_product_flash_attention_for_cpu',
    '_scaled_dot_product_efficient_attention', '_scaled_dot_product_cudnn_attention',
)

COSTLY_OPS = frozenset(getattr(torch.ops.aten, name).default
                       for name in _COSTLY_NAMES if hasattr(torch.ops.aten, name))
"""The ATen ops whose outputs a selective checkpoint keeps (those a torch build lacks are
left out)."""


def is_costly(op: object) -> bool:
    """Whether a selective checkpoint keeps the outputs of ``op`` (an ATen overload)."""
    return op in COSTLY_OPS


def _keep_costly(_context: object, op: object, *args, **kwargs) -> CheckpointPolicy:
    return CheckpointPolicy.MUST_SAVE if op in COSTLY_OPS else CheckpointPolicy.PREFER_RECOMPUTE


def selective_contexts() -> tuple:
    """The ``context_fn`` of a selective checkpoint (keep costly outputs, recompute the rest)."""
    return create_selective_checkpoint_contexts(_keep_costly)
