"""GraphInt8Hook: a compiled run trains with the int8 codec traced into its graphs; an eager
run, or one beside MemoryBudgetHook, is one line before training."""
from __future__ import annotations

import re

import pytest
import torch
from mmengine.runner import Runner
from torch._subclasses.fake_tensor import is_fake

import mmdropit.codecs.graph_codes as graph_codes
from tests.conftest import TINY_VIT, assert_one_line_error, log_text, two_iteration_cfg


@pytest.mark.slow
def test_a_compiled_run_trains_with_the_codec_in_its_graphs(tmp_path, monkeypatch):
    traced: list[bool] = []
    original = graph_codes.quantize

    def spy(values: torch.Tensor):
        traced.append(is_fake(values))
        return original(values)

    monkeypatch.setattr(graph_codes, 'quantize', spy)
    torch._dynamo.reset()  # the codec is traced in this run, whatever compiled before
    cfg = two_iteration_cfg(TINY_VIT, tmp_path, dict(type='GraphInt8Hook'))
    cfg.compile = True
    Runner.from_cfg(cfg).train()
    torch._dynamo.reset()
    log = log_text(tmp_path)
    assert 'GraphInt8Hook: the compiled graphs store what they save for backward in int8' in log
    losses = [float(v) for v in re.findall(r'Epoch\(train\).*?\bloss: ([0-9.]+)', log)]
    assert len(losses) == 2 and all(loss < 10 for loss in losses)
    assert len(traced) >= 8 and all(traced)  # each block's saved tensors, traced once


@pytest.mark.parametrize('extra,message', [
    ("custom_hooks = [dict(type='GraphInt8Hook')]",
     'GraphInt8Hook stores what compiled graphs save: set compile=True'),
    ("custom_hooks = [dict(type='GraphInt8Hook'), dict(type='MemoryBudgetHook', budget=0.5)]"
     "\ncompile = True", 'GraphInt8Hook beside MemoryBudgetHook'),
], ids=['eager', 'budget'])
def test_misuse_is_one_line_through_train_py(tmp_path, extra, message):
    assert_one_line_error(tmp_path, extra, message)
