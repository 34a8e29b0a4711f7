"""A test-only hook: the model runs out of memory on more samples than a device would hold
(a CPU has no limit to run into)."""
from __future__ import annotations

import torch
from mmengine.hooks import Hook
from mmengine.model import is_model_wrapper
from mmengine.registry import HOOKS


@HOOKS.register_module(force=True)  # imported by a test and by doctest collection
class DeviceCapacityHook(Hook):
    """From the start of training, a training forward pass of the network (the runner model's
    ``model``, as ``TimmClassifier`` holds it) over more than ``samples`` samples raises
    ``torch.OutOfMemoryError`` once it has run."""

    def __init__(self, samples: int) -> None:
        self.samples = samples

    def before_train(self, runner) -> None:
        model = runner.model.module if is_model_wrapper(runner.model) else runner.model

        def run_out(module, inputs, output) -> None:
            if module.training and output.shape[0] > self.samples:
                raise torch.OutOfMemoryError(f'{output.shape[0]} samples do not fit the device '
                                             f'(at most {self.samples})')

        model.model.register_forward_hook(run_out)
