"""Compact storage: round trips, encoding choice, bytes the meter sees, and the custom operators
that do the same for the fixed-count strategies."""
from __future__ import annotations

import contextlib

import pytest
import torch
from torch import nn

from mmdropit.dropit import to_dropit
from mmdropit.dropit.compact import (compress, decompress, encoded_bytes,
                                     flatten_in_memory_order, pack_bits, unpack_bits,
                                     worth_compressing)
from mmdropit.dropit.ops import keep_fixed, unkeep
from mmdropit.common.random_source import reseed
from mmdropit.dropit.strategies import kept_count, select
from mmdropit.kernels.switch import eager_only
from mmdropit.memory import SavedTensorMeter


@pytest.mark.parametrize('numel', [1, 7, 8, 9, 1000])
def test_bits_round_trip(numel):
    mask = torch.rand(numel) > 0.5
    packed = pack_bits(mask)
    assert packed.dtype == torch.uint8 and packed.numel() == (numel + 7) // 8
    assert torch.equal(unpack_bits(packed, numel), mask)


@pytest.mark.parametrize('keep_share,encoding', [(0.1, 'bitmask'), (0.01, 'indices')])
@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16, torch.float16])
def test_round_trip_picks_the_smaller_encoding(keep_share, encoding, dtype):
    x = torch.randn(4, 8, 16, 16).to(dtype)
    flat, order = flatten_in_memory_order(x)
    keep = torch.rand(flat.numel()) < keep_share
    tensors, layout = compress(flat, keep, 1.0, x.shape, order)
    assert layout.encoding == encoding
    sizes = encoded_bytes(flat.numel(), int(keep.sum()), x.element_size())
    assert layout.nbytes == sizes[encoding] == sum(t.numel() * t.element_size() for t in tensors)
    assert torch.equal(decompress(tensors, layout), torch.where(keep.view_as(x), x, 0))


def test_channels_last_is_read_in_memory_order_without_a_copy():
    x = torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last)
    flat, order = flatten_in_memory_order(x)
    assert flat.data_ptr() == x.data_ptr() and order == (0, 2, 3, 1)
    tensors, layout = compress(flat, flat.abs() > 0.5, 1.0, x.shape, order)
    rebuilt = decompress(tensors, layout)
    assert rebuilt.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(rebuilt, torch.where(x.abs() > 0.5, x, 0))


def test_worth_compressing_follows_the_byte_count():
    assert worth_compressing(0.9, 4) and worth_compressing(0.05, 4)
    assert not worth_compressing(0.02, 4) and not worth_compressing(0.05, 2)


def test_saved_bytes_of_one_layer_equal_the_hand_computed_compact_size():
    layer = to_dropit(nn.Linear(256, 64), gamma=0.9, exclude=[])
    x = torch.randn(32, 256, requires_grad=True)
    with SavedTensorMeter(layer) as meter:
        layer(x).sum().backward()
    numel, kept = 32 * 256, 32 * 256 - round(0.9 * 32 * 256)
    assert meter.result.total_bytes == numel // 8 + kept * 4  # bitmask + fp32 values
    assert meter.result.by_dtype == {'uint8': numel // 8, 'float32': kept * 4}


def test_tiny_gamma_keeps_the_input_dense_and_says_so_once():
    layer = to_dropit(nn.Linear(16, 4), gamma=0.02, exclude=[])
    x = torch.randn(8, 16)
    with pytest.warns(UserWarning, match='keeps its input dense'):
        layer(x).sum().backward()
    exact = layer.weight.grad.clone()
    layer.weight.grad = None
    with SavedTensorMeter(layer) as meter:
        layer(x).sum().backward()
    assert meter.result.total_bytes == x.numel() * 4
    assert torch.equal(layer.weight.grad, exact)


@pytest.mark.parametrize('strategy', ['mink', 'random'])
@pytest.mark.parametrize('gamma', [0.5, 0.9, 0.99])
def test_the_custom_operator_keeps_and_encodes_as_the_eager_functions(strategy, gamma):
    """The same tensors (``random`` on the eager path: its fused kernel draws another set,
    ``tests/kernels/test_cpu_kernels.py``)."""
    x = torch.randn(64, 3, 17).round(decimals=1)  # many ties at the threshold
    flat = x.reshape(-1)
    reseed(0)
    eager, eager_layout = compress(flat, *select(strategy, flat, gamma), x.shape, None)
    reseed(0)
    with eager_only() if strategy == 'random' else contextlib.nullcontext():
        custom, layout = keep_fixed(flat, gamma, strategy, x.shape, None)
    assert layout == eager_layout
    assert all(torch.equal(a, b) for a, b in zip(custom, eager))
    assert custom[1].numel() == kept_count(flat.numel(), gamma)
    assert torch.equal(unkeep(custom, layout), decompress(eager, eager_layout))
