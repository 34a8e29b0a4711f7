"""Conversion in place: same Parameters and keys, patterns, defaults, frozen layers, bad input."""
from __future__ import annotations

import copy

import pytest
import timm
import torch
from torch import nn

from mmdropit import ConfigError
from mmdropit.dropit import (DropITConfig, audit, dropit_layers, from_dropit, is_converted,
                             keep_ratio, set_gamma_scale, to_dropit)


def _vit() -> nn.Module:
    torch.manual_seed(0)
    return timm.create_model('vit_tiny_patch16_224', img_size=32, patch_size=8, depth=2,
                             num_classes=10)


def test_conversion_keeps_parameters_and_state_dict_keys():
    model = _vit()
    params = dict(model.named_parameters())
    state = {k: v.clone() for k, v in model.state_dict().items()}
    to_dropit(model, gamma=0.9)
    assert all(params[name] is p for name, p in model.named_parameters())
    assert list(model.state_dict()) == list(state)
    plain = _vit()
    plain.load_state_dict(model.state_dict())  # a DropIT checkpoint loads without DropIT
    model.load_state_dict(plain.state_dict())   # and the other way round
    from_dropit(model)
    assert not any(is_converted(m) for m in model.modules())
    assert all(torch.equal(v, state[k]) for k, v in model.state_dict().items())


def test_default_exclusion_leaves_first_layer_and_classifier_exact():
    model = to_dropit(_vit(), gamma=0.9)
    layers = dropit_layers(model)
    assert 'patch_embed.proj' not in layers and 'head' not in layers
    assert set(layers) == {f'blocks.{i}.{name}' for i in range(2)
                           for name in ('attn.qkv', 'attn.proj', 'mlp.fc1', 'mlp.fc2')}


def test_patterns_and_per_layer_gammas():
    model = _vit()
    report = DropITConfig(gamma={'*.fc2': 0.5, 'blocks.1': 0.8}, exclude=[]).apply(model).report
    gammas = {name: m.dropit.gamma for name, m in dropit_layers(model).items()}
    assert gammas == {'blocks.0.mlp.fc2': 0.5, 'blocks.1.attn.qkv': 0.8,
                      'blocks.1.attn.proj': 0.8, 'blocks.1.mlp.fc1': 0.8,
                      'blocks.1.mlp.fc2': 0.5}
    assert report.layers == list(gammas)


def test_frozen_layers_are_left_alone():
    model = _vit()
    for p in model.blocks[0].parameters():
        p.requires_grad_(False)
    report = DropITConfig(gamma=0.9).apply(model).report
    assert 'blocks.0.attn.qkv' in report.frozen
    assert not any(name.startswith('blocks.0') for name in dropit_layers(model))


def test_subclasses_are_matched_with_isinstance():
    mha = nn.MultiheadAttention(8, 2)
    model = nn.Sequential(nn.Linear(8, 8), mha)
    to_dropit(model, exclude=[])
    assert 'out_proj' in ''.join(dropit_layers(model))  # NonDynamicallyQuantizableLinear


def test_deepcopy_keeps_the_conversion():
    model = to_dropit(_vit(), gamma=0.9)
    clone = copy.deepcopy(model)
    assert set(dropit_layers(clone)) == set(dropit_layers(model))
    clone(torch.randn(2, 3, 32, 32)).sum().backward()
    assert keep_ratio(clone) == pytest.approx(0.1, abs=0.01)


def test_gamma_schedule_scales_every_layer():
    model = to_dropit(_vit(), gamma=0.8)
    set_gamma_scale(model, 0.5)
    assert {m.dropit.gamma for m in dropit_layers(model).values()} == {0.4}
    set_gamma_scale(model, 1.0)
    assert {m.dropit.gamma for m in dropit_layers(model).values()} == {0.8}


def test_mink_approx_keep_ratio_is_within_two_points():
    layer = to_dropit(nn.Linear(512, 8), gamma=0.9, strategy='mink_approx', exclude=[])
    layer(torch.randn(4096, 512)).sum().backward()
    assert keep_ratio(layer) == pytest.approx(0.1, abs=0.02)


@pytest.mark.parametrize('gamma', [-0.1, 1.0, 1.5, 'high', True])
def test_bad_gamma_is_a_clear_error(gamma):
    with pytest.raises(ConfigError, match=r'gamma must be a number in \[0, 1\)'):
        to_dropit(_vit(), gamma=gamma)


def test_unknown_strategy_is_a_clear_error():
    with pytest.raises(ConfigError, match="unknown DropIT strategy 'topk'.*'mink'"):
        to_dropit(_vit(), strategy='topk')


def test_pattern_matching_no_layer_warns_with_the_layer_names():
    with pytest.warns(UserWarning, match=r"'blocks\.9' matches no supported layer.*blocks\.0"):
        to_dropit(_vit(), exclude=['blocks.9'])


def test_model_without_supported_layer_is_a_clear_error():
    with pytest.raises(ConfigError, match='found no supported layer'):
        to_dropit(nn.Sequential(nn.ReLU(), nn.LayerNorm(4)))


def test_audit_names_the_op_that_keeps_a_dense_input():
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
                        nn.Conv2d(8, 8, 3), nn.GELU(), nn.Conv2d(8, 8, 3), nn.Sigmoid(),
                        nn.Conv2d(8, 4, 3))
    to_dropit(net, gamma=0.9)
    running_mean = net[1].running_mean.clone()
    x = torch.randn(2, 3, 16, 16)
    report = audit(net, lambda: net(x).sum())
    rows = {row.name: row for row in report.rows}
    assert rows['3'].freed and rows['3'].freed_bytes > 0           # after a lean ReLU
    assert rows['5'].freed                                            # GELU saves its input only
    assert not rows['7'].freed and rows['7'].kept_by == ['SigmoidBackward0.result']
    assert rows['7'].freed_bytes == -rows['7'].compact_bytes
    assert torch.equal(net[1].running_mean, running_mean)  # buffers restored
    assert 'SigmoidBackward0.result' in str(report)
