"""Compressed activations: what the chosen modules save is stored in int8 (the meter sees the
codes), the dense tensors are freed (a lower step peak), gradients stay within the rounding's
reach of exact, the conversion keeps Parameters and keys and is undone."""
from __future__ import annotations

import copy

import pytest
import timm
import torch
from torch import nn

from mmdropit.codecs import (GROUP, compress_activations, dequantize, quantize,
                             restore_activations)
from mmdropit.codecs.activations import observe_compression
from mmdropit.codecs.low_bit import low_bit_bytes
from mmdropit.dropit import audit, to_dropit
from mmdropit.errors import ConfigError
from mmdropit.memory import SavedTensorMeter, StepPeakMeter


def _mlp() -> nn.Module:
    return nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.LayerNorm(1024),
                         nn.Linear(1024, 10))


@pytest.mark.parametrize('dtype', [torch.float32, torch.bfloat16])
def test_int8_round_trip_is_within_half_a_step_of_each_group(dtype):
    values = (torch.randn(1000) * torch.linspace(0.01, 100, 1000)).to(dtype)
    codes, scales = quantize(values)
    steps = scales.repeat_interleave(GROUP)[:1000]
    assert codes.dtype == torch.int8 and dequantize(codes, scales, dtype).dtype == dtype
    rebuilt = dequantize(codes, scales, torch.float32)
    assert ((rebuilt - values.float()).abs() <= steps / 2 * (1 + 1e-5)).all()


def test_the_meter_sees_the_4_bit_codes():
    torch.manual_seed(0)
    model = _mlp()
    compress_activations(model, bits=4)
    with SavedTensorMeter(model) as compressed:
        model(torch.randn(64, 256)).sum().backward()
    # GELU's and LayerNorm's 64 x 1024 inputs: two codes a byte, a minimum and step per group
    assert compressed.result.by_dtype['uint8'] == 64 * 1024
    linear_inputs, norm_statistics = (64 * 256 + 64 * 1024) * 4, 2 * 64 * 4
    assert compressed.result.total_bytes == \
        2 * low_bit_bytes(64 * 1024, 4) + linear_inputs + norm_statistics


def test_the_meter_sees_the_codes_instead_of_the_dense_tensors():
    torch.manual_seed(0)
    model = _mlp()
    inputs = torch.randn(64, 256)
    with SavedTensorMeter(model) as dense:
        model(inputs).sum().backward()
    compress_activations(model)
    with SavedTensorMeter(model) as compressed:
        model(inputs).sum().backward()
    by_dtype = compressed.result.by_dtype
    # GELU's and LayerNorm's 64 x 1024 inputs become codes + one scale per GROUP values
    assert by_dtype['int8'] == 2 * 64 * 1024
    assert dense.result.by_dtype['float32'] - by_dtype['float32'] \
        == 2 * 64 * 1024 * 4 - 2 * 64 * 1024 // GROUP * 4


def test_the_step_peak_falls():
    """Eight Linear-GELU-LayerNorm blocks: GELU's and LayerNorm's inputs (two of the three
    tensors a block keeps) shrink to a quarter, so the activation peak to about 0.6."""
    torch.manual_seed(0)
    blocks = [layer for _ in range(8)
              for layer in (nn.Linear(256, 256), nn.GELU(), nn.LayerNorm(256))]
    model = nn.Sequential(*blocks, nn.Linear(256, 10))
    inputs = torch.randn(1024, 256)
    peaks = []
    for convert in (False, True):
        if convert:
            compress_activations(model)
        with StepPeakMeter(model, device='cpu') as meter:
            model(inputs).sum().backward()
        peaks.append(meter.result.activation_peak_bytes)
    assert peaks[1] < 0.7 * peaks[0]


@pytest.mark.parametrize('bits,bound', [(8, 0.02), (4, 0.3)])
def test_gradients_stay_close_and_restoring_makes_them_exact(bits, bound):
    """Every saved tensor of the norms, GELUs and attentions of a 2-block ViT in ``bits`` bits:
    each parameter's gradient within ``bound`` (relative norm) of the exact one (measured: 1.0%
    in 8 bits; 19% in 4 bits, a single draw of stochastic rounding)."""
    torch.manual_seed(0)
    vit = timm.create_model('vit_tiny_patch16_224', img_size=28, patch_size=7, in_chans=1,
                            embed_dim=96, depth=2, num_heads=3, num_classes=10)
    images = torch.randn(8, 1, 28, 28)
    exact = torch.autograd.grad(vit(images).logsumexp(1).mean(), list(vit.parameters()))
    keys, params = list(vit.state_dict()), list(vit.parameters())
    converted = compress_activations(vit, bits=bits)
    assert {'blocks.0.norm1', 'blocks.0.attn', 'blocks.0.mlp.act', 'norm'} <= set(converted)
    approx = torch.autograd.grad(vit(images).logsumexp(1).mean(), list(vit.parameters()))
    for e, a in zip(exact, approx):
        assert (a - e).norm() <= bound * e.norm() + 1e-7
    assert list(vit.state_dict()) == keys and list(vit.parameters()) == params
    assert restore_activations(vit) == converted
    again = torch.autograd.grad(vit(images).logsumexp(1).mean(), list(vit.parameters()))
    assert all(torch.equal(e, g) for e, g in zip(exact, again))


def test_compiled_the_saved_views_come_back_with_the_strides_the_backward_graph_asserts():
    """``torch.compile`` (inductor) of a ViT with 8-bit activations: attention saves its query,
    key and value as strided views of ``qkv``, and the compiled backward asserts their strides
    (it failed at ``assert_size_stride`` while they came back contiguous); they are stored as
    codes and the gradients stay within the 8-bit bound of the exact ones."""
    torch.manual_seed(0)
    vit = timm.create_model('vit_tiny_patch16_224', img_size=28, patch_size=7, in_chans=1,
                            embed_dim=96, depth=2, num_heads=3, num_classes=10)
    images = torch.randn(8, 1, 28, 28)
    exact = torch.autograd.grad(vit(images).logsumexp(1).mean(), list(vit.parameters()))
    compress_activations(vit, bits=8)
    stored: list[str] = []
    with observe_compression(lambda compression, dense, size: stored.append(compression.name)):
        loss = torch.compile(vit)(images).logsumexp(1).mean()
    approx = torch.autograd.grad(loss, list(vit.parameters()))
    assert stored.count('blocks.0.attn') >= 3
    for e, a in zip(exact, approx):
        assert (a - e).norm() <= 0.02 * e.norm() + 1e-7


def test_an_expanded_saved_tensor_stays_as_it_is():
    """A GELU given an expanded tensor (stride 0) saves it: its codes would outweigh the storage
    it views, so it is kept."""
    gelu = torch.nn.GELU()
    compress_activations(torch.nn.Sequential(gelu), bits=8)
    column = torch.randn(64, 1, requires_grad=True)
    stored: list[str] = []
    with observe_compression(lambda compression, dense, size: stored.append(compression.name)):
        gelu(column.expand(64, 128)).sum().backward()
    assert stored == []
    exact = column.detach().clone().requires_grad_()
    torch.nn.functional.gelu(exact.expand(64, 128)).sum().backward()
    assert torch.equal(column.grad, exact.grad)


def test_with_dropit_the_kept_values_inside_attention_are_int8_too():
    torch.manual_seed(0)
    vit = timm.create_model('vit_tiny_patch16_224', img_size=56, patch_size=7, in_chans=1,
                            embed_dim=96, depth=2, num_heads=3, num_classes=10)
    to_dropit(vit, gamma=0.9)
    twin = copy.deepcopy(vit)
    compress_activations(twin)
    images = torch.randn(8, 1, 56, 56)
    saved = []
    for model in (vit, twin):
        with SavedTensorMeter(model) as meter:
            model(images).sum().backward()
        saved.append(meter.result.total_bytes)
    assert saved[1] < 0.5 * saved[0]


@pytest.mark.parametrize('kwargs,message', [
    (dict(bits=3), r'compressed activations bits takes 8 .*, 4 or 2 .*; got 3'),
    (dict(bits=16), r'got 16'),
    (dict(names=['no.such']), r"found no module of Sequential matching names \['no.such'\]"),
    (dict(types=(nn.Conv2d,)), 'matching the module types Conv2d'),
])
def test_bad_settings_are_one_line(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        compress_activations(_mlp(), **kwargs)


def _checkpointed_vit() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    vit = timm.create_model('vit_tiny_patch16_224', img_size=28, patch_size=7, in_chans=1,
                            embed_dim=96, depth=4, num_heads=3, num_classes=10)
    return vit, torch.randn(8, 1, 28, 28)


def _grads(vit: nn.Module, images: torch.Tensor) -> tuple[list[torch.Tensor], int]:
    with SavedTensorMeter(vit) as meter:
        loss = vit(images).logsumexp(1).mean()
    return torch.autograd.grad(loss, list(vit.parameters())), meter.result.total_bytes


@pytest.mark.parametrize('checkpoints', ['ours', 'timm'])
def test_inside_a_plain_checkpoint_the_recomputation_stores_codes(checkpoints):
    """A plain checkpoint drops what its region saves and holds the codes of the recomputed
    tensors: the gradients are those of the compressed model without checkpoints (8 bits round
    to the nearest: the same codes), not the exact ones, and the forward saves less than with
    compression alone (0.15 of it here). So with the model's own checkpoints (timm's
    ``set_grad_checkpointing()``: ``torch.utils.checkpoint``, non-reentrant, comparing the two
    passes' saved tensors), where the modules' own hooks kept every block's codes through the
    first pass (0.59 of it)."""
    from mmdropit.checkpoint import checkpoint_module, uncheckpoint

    vit, images = _checkpointed_vit()
    exact, _ = _grads(vit, images)
    compress_activations(vit)
    compressed, compressed_bytes = _grads(vit, images)
    if checkpoints == 'ours':
        for block in vit.blocks:
            checkpoint_module(block)
    else:
        vit.set_grad_checkpointing()
    planned, planned_bytes = _grads(vit, images)
    for block in vit.blocks:
        uncheckpoint(block)
    assert all(torch.equal(a, b) for a, b in zip(planned, compressed))
    assert not all(torch.equal(a, b) for a, b in zip(planned, exact))
    assert planned_bytes < 0.3 * compressed_bytes


def test_8_bit_codes_of_a_count_not_a_multiple_of_4_come_back_inside_a_checkpoint():
    """A recomputed tensor's codes are joined into one byte tensor: int8 codes, then float32
    scales. With a count not a multiple of 4 the scales start unaligned, and backward failed
    to read them ("storage_offset must be divisible by 4"; met as a flaky failure of a memory
    budget test whose lossy choice varied with its timings)."""
    from mmdropit.checkpoint import checkpoint_module

    torch.manual_seed(0)
    block = nn.Sequential(nn.Linear(7, 7), nn.GELU(), nn.Linear(7, 3))
    x = torch.randn(746, 7, requires_grad=True)  # 5,222 elements a saved input (>= MIN_NUMEL)
    compress_activations(block, bits=8)
    expected = torch.autograd.grad(block(x).square().sum(), x)
    checkpoint_module(block)
    got = torch.autograd.grad(block(x).square().sum(), x)
    assert torch.equal(got[0], expected[0])


@pytest.mark.xfail(strict=True, reason='known miss (2026-11-26): inside a recomputed segment '
                   'a compressed GELU is encoded while its dense input is alive')
def test_a_nested_plan_on_top_of_compression_keeps_no_more_than_on_the_dense_model():
    """The least-memory plan of an MLP of eight Linear + GELU blocks nests ([0:4], [4:7] with
    blocks 4 and 5 inside): with the GELUs compressed it measures 350 KB, above the same plan on
    the dense GELUs (339 KB); compression without a plan holds 375 KB. The peak is in a
    recomputation, while a GELU's input is encoded: its dense input and its codes are alive at
    once, where the dense GELU holds its input alone. (Before stop 54 the meter also saw the
    eager codec's temporaries, and the codes were joined into one tensor, a copy: 500 KB.)"""
    from mmdropit.checkpoint import plan_checkpoints

    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(32, 64), *[nn.Sequential(nn.Linear(64, 64), nn.GELU())
                                               for _ in range(8)], nn.Linear(64, 10))
    images, labels = torch.randn(256, 32), torch.randint(0, 10, (256,))

    def loss():
        return nn.functional.cross_entropy(model(images), labels)

    def activation_peak() -> int:
        for _ in range(2):
            with StepPeakMeter(model) as meter:
                loss().backward()
            model.zero_grad(set_to_none=True)
        return meter.result.activation_peak_bytes

    to_dropit(model, 0.9, 'mink', value_bits=8)
    compress_activations(model, bits=8)
    plan = plan_checkpoints(model, loss)
    assert any(target.inner for target in plan.targets)
    plan.apply(model)
    compressed = activation_peak()
    restore_activations(model)
    dense = activation_peak()
    assert compressed <= dense


def test_inside_a_selective_checkpoint_the_converted_modules_step_aside():
    """A selective checkpoint replays its first pass's ops: the converted modules inside it run
    as the plain modules (the gradients are those of uncompressed blocks)."""
    from mmdropit.checkpoint import checkpoint_module, uncheckpoint

    vit, images = _checkpointed_vit()
    compress_activations(vit)
    for block in vit.blocks:
        checkpoint_module(block, selective=True)
    planned, _ = _grads(vit, images)
    for block in vit.blocks:
        uncheckpoint(block)
    restore_activations(vit.blocks)  # the final norm stays converted
    expected, _ = _grads(vit, images)
    assert all(torch.equal(a, b) for a, b in zip(planned, expected))


def test_the_audit_names_a_compressed_module_whose_dense_input_is_still_kept():
    """A LayerNorm after a Tanh: Tanh saves its result, which is the LayerNorm's input, so the
    norm's codes come on top of a dense copy; the GELU's input is freed."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 256), nn.Tanh(), nn.LayerNorm(256), nn.GELU(),
                        nn.Linear(256, 8))
    compress_activations(net, bits=4)
    report = audit(net, lambda: net(torch.randn(64, 32)).sum())
    rows = {row.name: row for row in report.rows}
    assert set(rows) == {'2', '3'} and {row.encoding for row in report.rows} == {'4-bit'}
    assert not rows['2'].freed and rows['2'].kept_by == ['TanhBackward0.result']
    assert rows['2'].freed_bytes == -rows['2'].compact_bytes == -low_bit_bytes(64 * 256, 4)
    assert rows['3'].freed and rows['3'].freed_bytes == 64 * 256 * 4 - low_bit_bytes(64 * 256, 4)
    assert '| 2 | 4-bit |' in str(report) and 'TanhBackward0.result' in str(report)
