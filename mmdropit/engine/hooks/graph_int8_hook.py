"""Store what the compiled training step saves for backward in int8, inside the compiled graphs.

Example config::

    custom_imports = dict(imports=['mmdropit'], allow_failed_imports=False)
    custom_hooks = [dict(type='GraphInt8Hook')]
    compile = True
"""
from __future__ import annotations

import contextlib

from mmengine.hooks import Hook
from mmengine.registry import HOOKS

from ...codecs.graph_codes import int8_graph_hooks
from ...errors import ConfigError
from ..runner_model import compiles_model
from .memory_budget_hook import MemoryBudgetHook


@HOOKS.register_module()
class GraphInt8Hook(Hook):
    """Hold :func:`mmdropit.codecs.graph_codes.int8_graph_hooks` around every training
    iteration of a compiled run: the compiled graphs are traced with the int8 codec in them and
    store every floating intermediate they save for backward (of at least 4096 elements) as
    int8 codes with a float32 scale per 32 values; eager code between the graphs does the same
    through the hooks.

    Priority ``LOWEST``: it takes effect after the other hooks' ``before_train_iter`` (a
    checkpoint plan records its step without it) and just before the step, whose first
    iteration compiles the graphs.

    Raises:
        ConfigError: Before training, in a run that does not compile (``compile=True``: the
            eager model's modules are converted by ``CompressActivationsHook(bits=8)``) or
            beside ``MemoryBudgetHook`` (whose eager trial passes would not see the codes).
    """

    priority = 'LOWEST'

    def __init__(self) -> None:
        self._iteration = contextlib.ExitStack()

    def before_run(self, runner) -> None:
        if not compiles_model(runner):
            raise ConfigError('GraphInt8Hook stores what compiled graphs save: set compile=True '
                              "in the config, or use dict(type='CompressActivationsHook', "
                              'bits=8) for an eager model')
        if any(isinstance(hook, MemoryBudgetHook) for hook in runner.hooks):
            raise ConfigError('GraphInt8Hook beside MemoryBudgetHook: the budget decides on '
                              'eager passes, which would not see the compiled codes; drop one '
                              "(MemoryBudgetHook(allow=['quantize']) offers 8-bit activations)")
        runner.logger.info('GraphInt8Hook: the compiled graphs store what they save for '
                           'backward in int8 (traced with the codec on the first iteration)')

    def before_train_iter(self, runner, batch_idx: int, data_batch=None) -> None:
        self._iteration.enter_context(int8_graph_hooks())

    def after_train_iter(self, runner, batch_idx: int, data_batch=None, outputs=None) -> None:
        self._iteration.close()
