"""ActivationOffloadHook in a Runner: it chooses the blocks holding the share on the first batch
(or takes names), says on CPU that nothing moves, trains, and takes its hooks off at the end."""
from __future__ import annotations

import re

import pytest
from mmengine.runner import Runner

import mmdropit  # noqa: F401
from mmdropit import ConfigError
from mmdropit.engine.hooks import ActivationOffloadHook
from tests.conftest import TINY_VIT, log_text, two_iteration_cfg


@pytest.mark.parametrize('hook,chosen', [
    (dict(share=0.3), 'model.blocks.0, model.blocks.1'),
    (dict(names=['model.blocks.3'], method='save_on_cpu'), 'model.blocks.3'),
], ids=['share', 'names'])
def test_the_hook_offloads_its_modules_and_the_run_trains(tmp_path, hook, chosen):
    runner = Runner.from_cfg(two_iteration_cfg(TINY_VIT, tmp_path,
                                               dict(type='ActivationOffloadHook', **hook)))
    runner.train()
    log = log_text(tmp_path)
    method = hook.get('method', 'prefetch')
    assert re.search(rf'Activation offload \({method}\) of \d+ modules: {re.escape(chosen)}'
                     r'.* \(the model is on cpu: nothing moves\)', log), log[-3000:]
    summary, = re.findall(r'mmdropit: ActivationOffloadHook: .*', log)
    assert re.fullmatch(rf'mmdropit: ActivationOffloadHook: activation offload \({method}\) of '
                        rf'\d+ modules: {re.escape(chosen)}.* \(the model is on cpu: nothing '
                        r'moves\)', summary), summary
    losses = [float(v) for v in re.findall(r'Epoch\(train\).*?\bloss: ([0-9.]+)', log)]
    assert len(losses) == 2 and all(loss < 10 for loss in losses)
    assert not any(module._forward_pre_hooks for module in runner.model.modules())


@pytest.mark.parametrize('kwargs,message', [
    ({}, 'takes names=\\[...\\] or share=0.5'),
    (dict(names=['a'], share=0.5), 'takes names=\\[...\\] or share=0.5'),
    (dict(names='backbone'), 'names take a list'),
    (dict(share=1.5), r'share must be in \(0, 1\], got 1.5'),
    (dict(share=0.5, method='nvme'), "method 'nvme': use one of prefetch, save_on_cpu"),
])
def test_bad_settings_are_one_line_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        ActivationOffloadHook(**kwargs)
