"""DropITHook in real MMEngine runs: conversion, logging, audit, EMA, checkpoints, DDP."""
from __future__ import annotations

import re

import pytest
import torch
from mmengine.runner import Runner

import mmdropit  # noqa: F401
from mmdropit import ConfigError
from mmdropit.dropit import dropit_layers, is_converted
from mmdropit.engine.hooks import DropITHook
from tests.conftest import (FLEXIBLE_RUNNER, TINY_VIT, TINY_VIT_2_ITERS, TINY_VIT_DROPIT,
                            assert_ranks_identical, log_text, run_tool, train_on_two_ranks,
                            two_iteration_cfg)


def test_hook_converts_logs_and_audits_in_a_runner(tmp_path):
    cfg = two_iteration_cfg(TINY_VIT_DROPIT, tmp_path)
    cfg.custom_hooks.append(dict(type='EMAHook'))
    runner = Runner.from_cfg(cfg)
    runner.train()
    layers = dropit_layers(runner.model.model)
    assert len(layers) == 4 * 4  # qkv, proj, fc1, fc2 in each of the 4 blocks
    ema_model = [h for h in runner.hooks if type(h).__name__ == 'EMAHook'][0].ema_model
    assert len(dropit_layers(ema_model.module)) == 16
    log = log_text(tmp_path)
    assert 'DropIT on 16 layers' in log and 'patch_embed.proj' in log
    ratios = [float(v) for v in re.findall(r'dropit_keep_ratio: ([0-9.]+)', log)]
    assert len(ratios) == 2 and all(abs(r - 0.1) < 0.01 for r in ratios)
    assert 'DropIT audit' in log and 'model.blocks.0.mlp.fc2' in log
    assert re.findall(r'mmdropit: DropITHook: .*', log) == [
        "mmdropit: DropITHook: DropIT on 16 layers, 0 lean activations; left exact: 2 excluded, "
        f"0 frozen (gamma 0.9, strategy 'mink'); the first iteration kept {ratios[0]:.3f} of "
        "the saved inputs"]
    checkpoint = torch.load(tmp_path / 'epoch_1.pth', weights_only=False)
    assert checkpoint['meta']['dropit'] == dict(gamma=0.9, strategy='mink', layers=16)


def test_checkpoints_cross_load_with_and_without_dropit(tmp_path):
    dropit_dir, plain_dir = tmp_path / 'dropit', tmp_path / 'plain'
    Runner.from_cfg(two_iteration_cfg(TINY_VIT_DROPIT, dropit_dir)).train()
    plain_cfg = two_iteration_cfg(TINY_VIT, plain_dir)
    plain_cfg.train_cfg.max_epochs = 2
    plain_cfg.load_from = str(dropit_dir / 'epoch_1.pth')
    plain_cfg.resume = True
    plain = Runner.from_cfg(plain_cfg)
    plain.train()  # a DropIT checkpoint resumes without DropIT
    assert plain.iter == 4 and not any(is_converted(m) for m in plain.model.modules())

    again_cfg = two_iteration_cfg(TINY_VIT_DROPIT, tmp_path / 'again')
    again_cfg.train_cfg.max_epochs = 3
    again_cfg.load_from = str(plain_dir / 'epoch_2.pth')
    again_cfg.resume = True
    again = Runner.from_cfg(again_cfg)
    again.train()  # and a plain checkpoint resumes with DropIT
    assert again.iter == 6
    assert 'trained without DropIT' in log_text(tmp_path / 'again')


@pytest.mark.parametrize('kwargs,message', [
    (dict(gamma=1.2), r'gamma must be a number in \[0, 1\)'),
    (dict(strategy='top'), "unknown DropIT strategy 'top'"),
    (dict(exclude='head'), 'take a list of name patterns'),
    (dict(warmup_iters=-1), 'warmup_iters must be'),
    (dict(value_bits=3), r'DropITHook value_bits \(or None\) takes 8 .*, 4 or 2 .*; got 3'),
])
def test_bad_hook_arguments_are_clear_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        DropITHook(**kwargs)


def test_bad_gamma_in_a_config_is_one_line_through_train_py(tmp_path):
    config = tmp_path / 'config.py'
    config.write_text(f"_base_ = r'{TINY_VIT_DROPIT}'\n"
                      "custom_hooks = [dict(type='DropITHook', gamma=9)]\n")
    result = run_tool('tools/train.py', str(config), '--work-dir', str(tmp_path), check=False)
    assert result.returncode != 0 and 'Traceback' not in result.stderr
    assert 'gamma must be a number in [0, 1)' in result.stderr


@pytest.mark.parametrize('runner', ['', FLEXIBLE_RUNNER], ids=['Runner', 'FlexibleRunner'])
def test_ddp_two_gloo_processes_stay_in_sync(tmp_path, runner):
    log = train_on_two_ranks(tmp_path, "dict(type='DropITHook', gamma=0.9, warmup_iters=2)",
                             runner)
    assert 'Distributed training: True' in log and 'DropIT on 16 layers' in log
    final = assert_ranks_identical(tmp_path)  # DDP kept the ranks identical
    initial = torch.load(tmp_path / 'rank0_initial.pt')
    assert any(not torch.equal(value, initial[key]) for key, value in final.items())  # trained


def test_mmengine_compile_trains_with_the_hook(tmp_path):
    """``compile=True`` (inductor) compiles ``train_step`` after the hook converted the model;
    the custom operators of the fixed-count strategies keep each DropIT layer in the graph."""
    result = run_tool('tools/train.py', str(TINY_VIT_DROPIT), '--work-dir', str(tmp_path),
                      '--cfg-options', *TINY_VIT_2_ITERS, 'compile=True')
    log = result.stdout + result.stderr
    assert 'Model has been "compiled"' in log
    lines = re.findall(r'Epoch\(train\) \[1\]\[\d/2\].*', log)
    assert len(lines) == 2 and all('dropit_keep_ratio: 0.1000' in line for line in lines)
    assert all(float(re.search(r'\bloss: ([0-9.]+)', line).group(1)) < 10 for line in lines)
