"""RebuiltActivationsHook in a Runner: the tiny ViT trains with its GELUs' outputs rebuilt, to
the plain run's losses, and a bad value is one line."""
from __future__ import annotations

import re

from mmengine.runner import Runner

import mmdropit  # noqa: F401
from mmdropit.codecs.rebuilt_activations import RebuildingActivation, RebuildingLayer
from tests.conftest import TINY_VIT, assert_one_line_error, log_text, two_iteration_cfg


def _losses(work_dir) -> list[str]:
    return re.findall(r'Epoch\(train\).*?\bloss: ([0-9.]+)', log_text(work_dir))


def test_the_hook_converts_and_the_run_trains_to_the_plain_losses(tmp_path):
    runner = Runner.from_cfg(two_iteration_cfg(TINY_VIT, tmp_path / 'rebuilt',
                                               dict(type='RebuiltActivationsHook')))
    runner.train()
    modules = list(runner.model.modules())
    assert sum(isinstance(m, RebuildingActivation) for m in modules) == 4  # one GELU a block
    assert sum(isinstance(m, RebuildingLayer) for m in modules) == 4 * 4 + 2
    assert re.findall(r'mmdropit: RebuiltActivationsHook: .*', log_text(tmp_path / 'rebuilt')) == [
        'mmdropit: RebuiltActivationsHook: rebuilt activations: 4 activations, 18 layers '
        'converted']
    Runner.from_cfg(two_iteration_cfg(TINY_VIT, tmp_path / 'plain')).train()
    rebuilt, plain = _losses(tmp_path / 'rebuilt'), _losses(tmp_path / 'plain')
    assert len(plain) == 2 and rebuilt == plain


def test_a_bad_value_is_one_line(tmp_path):
    assert_one_line_error(tmp_path, "custom_hooks = [dict(type='RebuiltActivationsHook', "
                                    "types='GELU')]",
                          "RebuiltActivationsHook types take a list, e.g. types=['GELU', 'SiLU']")
