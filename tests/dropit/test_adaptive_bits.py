"""Adaptive bits: the widths chosen fit the configured bytes with the least modelled error, the
measurement tells a sensitive slot from an insensitive one and leaves training state alone."""
from __future__ import annotations

import itertools
import random

import pytest
import torch
from torch import nn

from mmdropit import ConfigError
from mmdropit.checkpoint import checkpoint_module
from mmdropit.codecs import BITS, compress_activations
from mmdropit.dropit import to_dropit
from mmdropit.dropit.adaptive_bits import (_BYTE_UNITS, BitsSlot, _allocate, adapt_bits,
                                           set_bits)


def _slot(name: str, values: int, error: float, bits: int = 4) -> BitsSlot:
    return BitsSlot(name, 'activations', values, error, bits, bits)


@pytest.mark.parametrize('seed', range(40))
def test_the_allocation_is_the_least_error_within_the_budget(seed):
    rng = random.Random(seed)
    slots = [_slot(str(i), rng.choice([512, 4096, 30000, 100352]), 10 ** rng.uniform(-6, 2),
                   rng.choice(BITS)) for i in range(rng.randint(1, 6))]
    budget = sum(slot.bytes_at(slot.configured_bits) for slot in slots)
    chosen = _allocate(slots, budget)
    spent = sum(slot.bytes_at(slot.bits) for slot in chosen)
    error = sum(slot.error_at(slot.bits) for slot in chosen)
    assert spent <= budget
    assert error <= sum(slot.error_at(slot.configured_bits) for slot in slots)
    margin = len(slots) * budget / _BYTE_UNITS  # the knapsack rounds each slot's bytes up
    within = [sum(s.error_at(b) for s, b in zip(slots, widths))
              for widths in itertools.product(BITS, repeat=len(slots))
              if sum(s.bytes_at(b) for s, b in zip(slots, widths)) <= budget - margin]
    best = min(within, default=float('inf'))
    assert error <= best * (1 + 1e-9)


class _Branches(nn.Module):
    """Three LayerNorm branches of one input whose outputs count 10, 1 and 1 times in
    the loss (the first is the sensitive one); a fourth that counts zero times; dropout and a
    BatchNorm whose state must survive the measurement."""

    def __init__(self) -> None:
        super().__init__()
        self.stem = nn.Linear(32, 256)
        self.norms = nn.ModuleList(nn.LayerNorm(256) for _ in range(4))
        self.heads = nn.ModuleList(nn.Linear(256, 8) for _ in range(4))
        self.weights = (10.0, 1.0, 1.0, 0.0)
        self.drop = nn.Dropout(0.1)
        self.bn = nn.BatchNorm1d(256)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.drop(self.bn(self.stem(x)))
        return sum(w * head(norm(h).square())
                   for w, norm, head in zip(self.weights, self.norms, self.heads))


def test_the_sensitive_slot_gets_the_bits_and_training_state_is_left_alone():
    torch.manual_seed(0)
    net = _Branches()
    compress_activations(net, bits=4, names=['norms.*'])
    x = torch.randn(256, 32)
    running_mean = net.bn.running_mean.clone()
    rng = torch.get_rng_state()
    allocation = adapt_bits(net, lambda: net(x).square().mean())
    assert torch.equal(torch.get_rng_state(), rng)
    assert torch.equal(net.bn.running_mean, running_mean)
    assert int(net.bn.num_batches_tracked) == 0
    assert all(p.grad is None for p in net.parameters())
    assert allocation.chosen == {'norms.0': 8, 'norms.1': 2, 'norms.2': 2, 'norms.3': 4}
    assert [slot.measured for slot in allocation.slots] == [True, True, True, False]
    assert allocation.bytes <= allocation.budget_bytes
    assert allocation.error < allocation.error_before
    assert [norm.compression.bits for norm in net.norms] == [8, 2, 2, 4]
    assert 'no gradient through it: kept' in allocation.table().splitlines()[4]


def _dropit_mlp() -> tuple[nn.Module, torch.Tensor]:
    """An MLP whose DropIT layers keep 4-bit values and whose GELUs save 4-bit codes."""
    torch.manual_seed(0)
    net = to_dropit(nn.Sequential(nn.Linear(32, 64), nn.GELU(), nn.Linear(64, 64), nn.GELU(),
                                  nn.Linear(64, 8)), gamma=0.5, value_bits=4,
                    lean_activations=False)
    compress_activations(net, bits=4)
    return net, torch.randn(128, 32)


def test_dropit_values_are_slots_and_set_bits_applies_a_choice():
    net, x = _dropit_mlp()
    allocation = adapt_bits(net, lambda: net(x).square().mean())
    assert {slot.name: slot.kind for slot in allocation.slots} == {
        '1': 'activations', '2': 'dropit values', '3': 'activations', '4': 'dropit values'}
    assert all(slot.values > 0 and slot.error > 0 for slot in allocation.slots)
    set_bits(net, {'2': 8, '3': 2})
    assert net[2].dropit.value_bits == 8 and net[3].compression.bits == 2
    with pytest.raises(ConfigError, match="'0' is not a DropIT layer with value_bits"):
        set_bits(net, {'0': 8})


def test_a_model_with_nothing_stored_as_codes_is_a_clear_error():
    net = nn.Sequential(nn.Linear(4, 4))
    with pytest.raises(ConfigError, match='adaptive bits found nothing stored as codes in '
                                          'Sequential'):
        adapt_bits(net, lambda: net(torch.randn(2, 4)).sum())


def test_slots_inside_a_plain_checkpoint_are_measured_by_their_recomputation():
    net, x = _dropit_mlp()
    plain = adapt_bits(net, lambda: net(x).square().mean())
    set_bits(net, {slot.name: 4 for slot in plain.slots})
    checkpoint_module(net)
    planned = adapt_bits(net, lambda: net(x).square().mean())
    assert [(s.name, s.values) for s in planned.slots] == [(s.name, s.values) for s in plain.slots]
    assert all(slot.measured for slot in planned.slots)
