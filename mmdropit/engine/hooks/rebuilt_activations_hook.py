"""Rebuild activation outputs in backward instead of keeping a copy in the layer after them
(exact; :mod:`mmdropit.codecs.rebuilt_activations`).

Example config::

    custom_imports = dict(imports=['mmdropit'], allow_failed_imports=False)
    custom_hooks = [dict(type='RebuiltActivationsHook')]
"""
from __future__ import annotations

from collections.abc import Sequence

from mmengine.registry import HOOKS

from ...codecs import AppliedRebuilt, RebuiltActivationsConfig
from ..runner_model import unwrap
from .summary import SummaryHook


@HOOKS.register_module()
class RebuiltActivationsHook(SummaryHook):
    """Convert the model's GELU / SiLU / Hardswish / Mish activations, and its Linear and
    convolution layers, with :func:`mmdropit.rebuild_activations` before training starts: a
    layer called on an activation's output keeps a note to rebuild it from the activation's
    input, which the activation keeps anyway, instead of a copy. The gradients are the same bit
    for bit.

    The conversion is in place and keeps Parameters, buffers and ``state_dict`` keys, so
    optimizers, DDP, ``load_from`` and ``resume`` are unaffected. Priority ``VERY_HIGH``, as
    ``DropITHook``, so ``EMAHook`` copies the converted model. Inside checkpoints, activation
    offload and compressed activations the modules run plain; under ``compile=True`` too (the
    compiler recomputes such outputs itself).

    Args:
        types: Class names of the activations to convert (e.g. ``['GELU']``); ``None``: GELU,
            SiLU, Hardswish and Mish. Each must compute its output from its one input alone.
    """

    priority = 'VERY_HIGH'

    def __init__(self, types: Sequence[str] | None = None) -> None:
        self.config = RebuiltActivationsConfig(types, where='RebuiltActivationsHook')
        self._applied: AppliedRebuilt | None = None

    def before_run(self, runner) -> None:
        self._applied = self.config.apply(unwrap(runner.model))

    def summary(self, runner) -> str:
        return self._applied.summary
