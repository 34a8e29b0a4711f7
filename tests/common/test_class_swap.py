"""One class swap for every technique: classes made once, layers that stack in the order they
are put in, and removal in any order."""
from __future__ import annotations

import copy

import torch
from torch import nn

from mmdropit.checkpoint.apply import (checkpoint_module, checkpoint_siblings, is_checkpointed,
                                       uncheckpoint)
from mmdropit.codecs import compress_activations, restore_activations
from mmdropit.common.class_swap import ClassSwap
from mmdropit.dropit import dropit_layers, from_dropit, is_converted, to_dropit


class Doubled:
    def forward(self, x):
        return super().forward(x) * 2


class Negated:
    def forward(self, x):
        return -super().forward(x)


class Tripled:
    def forward(self, x):
        return super().forward(x) * 3


def test_a_class_is_made_once_per_mixin_and_class():
    swap = ClassSwap('Doubled')
    first, second = nn.Linear(2, 2), nn.Linear(2, 2)
    swap.swap_in(first, Doubled)
    swap.swap_in(second, Doubled)
    assert type(first) is type(second)
    assert type(first).__name__ == 'DoubledLinear'
    assert type(first).__module__ == nn.Linear.__module__
    assert type(copy.deepcopy(first)) is type(first)


def test_a_second_swap_of_one_technique_replaces_its_layer():
    doubled, negated = ClassSwap('Doubled'), ClassSwap('Negated')
    layer = nn.Identity()
    doubled.swap_in(layer, Doubled)
    negated.swap_in(layer, Negated)
    doubled.swap_in(layer, Tripled, prefix='Tripled')
    assert type(layer).__name__ == 'NegatedTripledIdentity'
    assert doubled.base_of(layer) is nn.Identity
    assert layer(torch.ones(1)).item() == -3


def test_layers_come_out_in_any_order():
    doubled, negated = ClassSwap('Doubled'), ClassSwap('Negated')
    layer = nn.Identity()
    assert not doubled.swap_out(layer) and type(layer) is nn.Identity
    doubled.swap_in(layer, Doubled)
    negated.swap_in(layer, Negated)
    assert layer(torch.ones(1)).item() == -2
    assert negated.base_of(layer).__name__ == 'DoubledIdentity'
    assert doubled.swap_out(layer)
    assert type(layer).__name__ == 'NegatedIdentity' and layer(torch.ones(1)).item() == -1
    negated.swap_in(layer, Negated)  # the same layer again: the same class
    assert type(layer).__name__ == 'NegatedIdentity'
    assert negated.swap_out(layer) and type(layer) is nn.Identity


def test_dropit_and_a_checkpoint_on_one_layer_stack_either_way():
    for dropit_first in (True, False):
        model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 8), nn.Linear(8, 2))
        if dropit_first:
            to_dropit(model, exclude=[])
        checkpoint_module(model[1])
        if not dropit_first:
            to_dropit(model, exclude=[])
        expected = 'CheckpointedDropITLinear' if dropit_first else 'DropITCheckpointedLinear'
        assert type(model[1]).__name__ == expected
        assert is_converted(model[1]) and is_checkpointed(model[1])
        assert set(dropit_layers(model)) == {'0', '1', '2'}
        if dropit_first:  # the checkpoint outside: DropIT selects in its recomputation
            model(torch.randn(4, 8)).sum().backward()
        uncheckpoint(model[1])
        assert type(model[1]).__name__ == 'DropITLinear'
        from_dropit(model)
        assert all(type(layer) is nn.Linear for layer in model)


def test_removing_dropit_first_leaves_the_checkpoint():
    model = nn.Sequential(nn.Linear(8, 8), nn.Linear(8, 2))
    to_dropit(model, exclude=[])
    checkpoint_module(model[1])
    from_dropit(model)
    assert type(model[1]).__name__ == 'CheckpointedLinear' and not hasattr(model[1], 'dropit')
    uncheckpoint(model[1])
    assert type(model[1]) is nn.Linear


def test_compressed_siblings_run_the_compressed_forward_in_the_checkpoint():
    class Stem(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.act = nn.Linear(64, 64), nn.GELU()

        def forward(self, x):
            return self.act(self.fc(x)).square().mean()

    stem = Stem()
    compress_activations(stem)
    checkpoint_siblings(stem, ('fc', 'act'))
    assert type(stem.act).__name__ == 'CheckpointedCompressedGELU'
    stem(torch.randn(64, 64, requires_grad=True)).backward()
    assert restore_activations(stem) == ['act']
    assert type(stem.act).__name__ == 'CheckpointedGELU'
    uncheckpoint(stem.fc)
    uncheckpoint(stem.act)
    assert type(stem.fc) is nn.Linear and type(stem.act) is nn.GELU
