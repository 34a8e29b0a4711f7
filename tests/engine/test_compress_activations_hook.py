"""CompressActivationsHook in a Runner: with DropIT (8-bit values) on the tiny ViT, what the
norms, GELUs and attentions save is stored in int8, and the run trains and checkpoints."""
from __future__ import annotations

import re

import pytest
import torch
from mmengine.runner import Runner

import mmdropit  # noqa: F401
from mmdropit import ConfigError
from mmdropit.codecs import CompressedActivations
from mmdropit.engine.hooks import CompressActivationsHook
from tests.conftest import TINY_VIT, TINY_VIT_DROPIT, log_text, two_iteration_cfg


def test_the_hook_converts_and_the_run_trains(tmp_path):
    cfg = two_iteration_cfg(TINY_VIT_DROPIT, tmp_path,
                            dict(type='CompressActivationsHook', audit=True))
    cfg.custom_hooks[0] = dict(type='DropITHook', gamma=0.9, value_bits=8)
    cfg.custom_hooks.append(dict(type='MemoryReportHook', interval=1))
    runner = Runner.from_cfg(cfg)
    runner.train()
    converted = [m for m in runner.model.modules() if isinstance(m, CompressedActivations)]
    assert len(converted) == 4 * 4 + 1  # per block: two norms, attention, GELU; the last norm
    log = log_text(tmp_path)
    assert 'Compressed activations (8-bit) in 17 modules: model.blocks.0.norm1' in log
    assert re.findall(r'mmdropit: CompressActivationsHook: .*', log) == [
        'mmdropit: CompressActivationsHook: compressed activations in 17 modules (8-bit)']
    assert len(re.findall(r'mmdropit: DropITHook: DropIT on 16 layers', log)) == 1
    audit = log.split('Compressed activations audit')[1]
    assert re.search(r'\| model\.blocks\.0\.mlp\.act \| 8-bit \| [0-9.]+ \| [0-9.]+ \| [0-9.]+ \| - \|',
                     audit), audit[:3000]
    losses = [float(v) for v in re.findall(r'Epoch\(train\).*?\bloss: ([0-9.]+)', log)]
    assert len(losses) == 2 and all(loss < 10 for loss in losses)
    plain = Runner.from_cfg(two_iteration_cfg(TINY_VIT, tmp_path / 'plain'))
    plain.load_checkpoint(str(tmp_path / 'epoch_1.pth'))  # keys unchanged: loads strictly
    assert torch.equal(plain.model.model.head.weight, runner.model.model.head.weight)


def test_adaptive_bits_choose_widths_on_the_first_batch_and_again_at_the_interval(tmp_path):
    cfg = two_iteration_cfg(TINY_VIT_DROPIT, tmp_path, dict(
        type='CompressActivationsHook', bits=4, adaptive_bits=True, adapt_interval=1))
    cfg.custom_hooks[0] = dict(type='DropITHook', gamma=0.9, value_bits=4)
    runner = Runner.from_cfg(cfg)
    runner.train()
    log = log_text(tmp_path)
    table = log.split('Adaptive bits, measured on the first batch:')[1]
    assert re.search(r'model\.blocks\.0\.mlp\.fc1 +dropit values +\d+ +[0-9.e+-]+ +4 -> [248]',
                     table), table[:2000]
    assert re.search(r'model\.blocks\.0\.norm1 +activations +\d+ +[0-9.e+-]+ +4 -> [248]', table)
    codes, configured = map(float, re.search(r'codes ([0-9.]+) MiB \(configured ([0-9.]+) MiB\)',
                                             table).groups())
    assert codes <= configured
    assert re.search(r'Adaptive bits re-measured at iteration 1: (\d+ slots at \d bits(, )?)+',
                     log)
    summary, = re.findall(r'mmdropit: CompressActivationsHook: .*', log)
    assert re.fullmatch(r'mmdropit: CompressActivationsHook: compressed activations in 17 modules '
                        r'\(4-bit\); adaptive bits chose (\d+ slots at [248] bits(, |$))+',
                        summary), summary
    widths = {m.compression.bits for m in runner.model.modules()
              if isinstance(m, CompressedActivations)}
    assert widths <= {2, 4, 8} and widths != {4}
    losses = [float(v) for v in re.findall(r'Epoch\(train\).*?\bloss: ([0-9.]+)', log)]
    assert len(losses) == 2 and all(loss < 10 for loss in losses)


@pytest.mark.parametrize('kwargs,message', [
    (dict(bits=3), r'CompressActivationsHook bits takes 8 .*, 4 or 2 .*; got 3'),
    (dict(adapt_interval=10), 'adapt_interval takes a positive number of iterations, with '
                              'adaptive_bits=True; got 10'),
    (dict(adaptive_bits=True, adapt_interval=0), 'adapt_interval takes a positive number'),
    (dict(types='LayerNorm'), 'types / names take a list'),
])
def test_bad_hook_arguments_are_clear_errors(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        CompressActivationsHook(**kwargs)
