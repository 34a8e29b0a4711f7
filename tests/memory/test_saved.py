"""SavedTensorMeter: exact byte counts worked out by hand from what autograd saves."""
import weakref

import pytest
import torch
import torch.utils.checkpoint as cp
from torch import nn

from mmdropit.memory import SavedActivations, SavedTensorMeter, measure_saved_activations

F32 = 4
BF16 = 2


@pytest.fixture
def mlp() -> nn.Sequential:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32))


def _step(net: nn.Module, x: torch.Tensor) -> None:
    net(x).sum().backward()


def test_mlp_by_hand(mlp):
    # Linear1 (x needs no grad) saves x for its weight gradient: 8*64 floats. ReLU saves its
    # output: 8*128 floats. Linear2 saves that same output (same storage: counted once) and
    # W2.t() (a view of a parameter: left out). sum() saves only sizes.
    with SavedTensorMeter(mlp) as meter:
        _step(mlp, torch.randn(8, 64))
    expected = (8 * 64 + 8 * 128) * F32
    assert meter.result == SavedActivations(expected, 2, {'float32': expected})
    assert expected == 6144


def test_parameters_are_left_out_only_when_the_model_is_given(mlp):
    with SavedTensorMeter() as meter:
        _step(mlp, torch.randn(8, 64))
    # Without a model, W2 (saved for the gradient of Linear2's input) counts too.
    assert meter.result.total_bytes == 6144 + 128 * 32 * F32
    assert meter.result.num_tensors == 3


def test_input_requiring_grad_adds_only_parameter_views(mlp):
    # Now Linear1 also saves W1.t() (for the input gradient): a parameter, left out.
    with SavedTensorMeter(mlp) as meter:
        _step(mlp, torch.randn(8, 64, requires_grad=True))
    assert meter.result.total_bytes == 6144


def test_views_and_repeated_saves_share_one_storage():
    a = torch.randn(8, 64, requires_grad=True)

    def forward() -> torch.Tensor:
        h = a.exp()  # saves h
        top, bottom = h[:4], h[4:]  # views of h's storage
        return (top * top).sum() + (bottom * a[4:]).sum()  # saves top twice, bottom, a[4:]

    _, saved = measure_saved_activations(forward)
    # Five saves, two storages: h's and a's (a is an input here, not a parameter).
    assert saved == SavedActivations(2 * 8 * 64 * F32, 2, {'float32': 2 * 8 * 64 * F32})


def test_bfloat16_model(mlp):
    mlp.to(torch.bfloat16)
    with SavedTensorMeter(mlp) as meter:
        _step(mlp, torch.randn(8, 64, dtype=torch.bfloat16))
    expected = (8 * 64 + 8 * 128) * BF16
    assert meter.result == SavedActivations(expected, 2, {'bfloat16': expected})


def test_cpu_autocast_counts_the_bfloat16_weight_copies(mlp):
    # Under autocast Linear1 saves the bf16 copy of x, ReLU its bf16 output, and Linear2 the bf16
    # copy of W2: a new storage made by autocast, not a parameter, so it is counted.
    with SavedTensorMeter(mlp) as meter:
        with torch.autocast('cpu', dtype=torch.bfloat16):
            out = mlp(torch.randn(8, 64))
        out.float().sum().backward()
    expected = (8 * 64 + 8 * 128 + 128 * 32) * BF16
    assert meter.result == SavedActivations(expected, 3, {'bfloat16': expected})


def test_saved_storages_are_not_kept_alive(mlp):
    x = torch.randn(8, 64)
    relu_outputs = []
    mlp[1].register_forward_hook(
        lambda module, args, out: relu_outputs.append(weakref.ref(out.untyped_storage())))
    with SavedTensorMeter(mlp) as meter:
        _step(mlp, x)
        assert relu_outputs[0]() is None  # freed by backward although the meter runs
        _step(mlp, x)
    # x is the same storage in both steps (once); the two ReLU outputs are two storages.
    assert meter.result.total_bytes == 8 * 64 * F32 + 2 * 8 * 128 * F32
    assert meter.result.num_tensors == 3


def test_a_freed_address_taken_by_a_new_storage_counts_again():
    a = torch.randn(256, requires_grad=True)
    addresses = []
    with SavedTensorMeter() as meter:
        for _ in range(4):
            h = a.exp()  # saves h: 1 KiB, freed by the backward below
            addresses.append(h.data_ptr())
            torch.autograd.grad(h.sum(), a)
            del h
    assert meter.result == SavedActivations(4 * 256 * F32, 4, {'float32': 4 * 256 * F32})
    if len(set(addresses)) == 4:  # glibc handed out a new block each time: no reuse to count
        pytest.skip('the CPU allocator reused no freed address in this run')


@pytest.mark.parametrize('reentrant', [True, False])
def test_checkpoint_counts_its_inputs_not_its_recomputation(mlp, reentrant):
    x = torch.randn(8, 64, requires_grad=True)
    with SavedTensorMeter(mlp) as meter:
        cp.checkpoint(mlp, x, use_reentrant=reentrant).sum().backward()
    # Only the checkpoint's input is kept; the recomputation in backward is not a saved
    # activation of the forward pass.
    assert meter.result == SavedActivations(8 * 64 * F32, 1, {'float32': 8 * 64 * F32})


def test_meta_and_empty_tensors_are_skipped():
    class SavesOddTensors(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x):
            ctx.save_for_backward(torch.empty(0), torch.empty(3, device='meta'), x.new_ones(4))
            return x.clone()

        @staticmethod
        def backward(ctx, grad):
            return grad

    x = torch.randn(2, requires_grad=True)
    _, saved = measure_saved_activations(lambda: SavesOddTensors.apply(x).sum())
    assert saved == SavedActivations(4 * F32, 1, {'float32': 4 * F32})


def test_measure_returns_the_forward_output_and_leaves_autograd_unchanged(mlp):
    x = torch.randn(8, 64)
    reference = mlp(x).sum()
    reference.backward()
    expected = [p.grad.clone() for p in mlp.parameters()]
    mlp.zero_grad()
    loss, saved = measure_saved_activations(lambda: mlp(x).sum(), mlp)
    loss.backward()
    assert torch.equal(loss, reference)
    assert all(torch.equal(p.grad, g) for p, g in zip(mlp.parameters(), expected))
    assert saved.total_bytes == 6144


def test_double_backward_still_works():
    x = torch.randn(16, requires_grad=True)

    def second_derivative() -> torch.Tensor:
        (grad,) = torch.autograd.grad(x.sin().sum(), x, create_graph=True)
        (grad2,) = torch.autograd.grad(grad.sum(), x)
        return grad2

    with SavedTensorMeter():
        measured = second_derivative()
    assert torch.allclose(measured, -x.sin())


def test_nothing_is_counted_after_stop(mlp):
    meter = SavedTensorMeter(mlp)
    meter.start()
    _step(mlp, torch.randn(8, 64))
    assert meter.stop().total_bytes == 6144
    _step(mlp, torch.randn(8, 64))  # hooks are gone: nothing more is counted
    assert meter.result.total_bytes == 6144
