"""Every DropIT config loads, builds its model and converts it with its DropITHook."""
from __future__ import annotations

import pytest
from mmengine.config import Config
from mmengine.registry import HOOKS, MODELS, DefaultScope

import mmdet.registry  # noqa: F401  (mmdet's scope for the detection configs)
import mmdropit  # noqa: F401
from mmdropit.dropit import dropit_layers, is_converted
from tests.conftest import ROOT

CONFIGS = sorted(path for path in (ROOT / 'configs').rglob('*dropit*.py'))
EXACT = {  # layers the default exclusion must leave exact, per config family
    'vit-tiny': ['model.patch_embed.proj', 'model.head'],
    'resnet18': ['model.conv1', 'model.fc'],
    'deit-ti': ['model.patch_embed.proj', 'model.head'],
    'deit-s': ['model.patch_embed.proj', 'model.head'],
    'deit-b': ['model.patch_embed.proj', 'model.head'],
    'faster-rcnn': ['backbone.conv1', 'rpn_head.rpn_cls', 'roi_head.bbox_head.fc_cls',
                    'roi_head.bbox_head.fc_reg'],
    'mask-rcnn': ['backbone.conv1', 'roi_head.bbox_head.fc_cls', 'roi_head.mask_head.conv_logits'],
}


def test_every_family_has_a_dropit_config():
    assert {path.stem.split('_')[0] for path in CONFIGS} == set(EXACT)


@pytest.mark.parametrize('path', CONFIGS, ids=[path.stem for path in CONFIGS])
def test_dropit_config_builds_and_converts(path):
    cfg = Config.fromfile(path)
    hooks = [hook for hook in cfg.custom_hooks if hook['type'] == 'DropITHook']
    assert len(hooks) == 1
    if 'pretrained_file' in cfg.model:
        cfg.model.pretrained_file = None  # the user's local weights file is not here
    with DefaultScope.overwrite_default_scope(cfg.get('default_scope')):
        model = MODELS.build(cfg.model)
    report = HOOKS.build(hooks[0]).apply(model)
    assert report.layers and report.layers == sorted(dropit_layers(model), key=report.layers.index)
    gamma = float(path.stem.split('mink')[1].split('_')[0])
    assert {m.dropit.gamma for m in dropit_layers(model).values()} == {gamma}
    named = dict(model.named_modules())
    for name in EXACT[path.stem.split('_')[0]]:
        assert not is_converted(named[name]), name
