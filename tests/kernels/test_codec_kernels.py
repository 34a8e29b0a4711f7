"""The fused codec kernels. int8: codes, scales and rebuilt values equal the eager path's bit
for bit. 4 and 2 bits: minimums, steps and rebuilt values equal the eager path's bit for bit,
each code is one of the two levels around its value, and the codes depend on the seed alone
(not on the number of threads). Unbiasedness: tests/codecs/test_low_bit.py runs on both paths.
AVX-512 against the portable loops: tests/kernels/test_cpu_kernels.py."""
from __future__ import annotations

import shutil

import pytest
import torch
from torch import nn
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode

from mmdropit.checkpoint import checkpoint_run
from mmdropit.codecs import GROUP, compress_activations
from mmdropit.codecs.int8 import dequantize, quantize
from mmdropit.codecs.low_bit import dequantize_low, quantize_low, unpack_codes
from mmdropit.kernels import cpu as fused_cpu
from mmdropit.kernels.switch import eager_only
from mmdropit.memory import StepPeakMeter
from tests.helpers.kernel_inputs import KINDS, kernel_input

pytestmark = pytest.mark.skipif(shutil.which('c++') is None, reason='no C++ compiler here')

DTYPES = (torch.float32, torch.bfloat16, torch.float16, torch.float64)
SIZES = (1, 7, GROUP, 1000, 70_001)


@pytest.fixture(autouse=True, scope='module')
def loaded_kernels():
    """The tests call ``torch.ops.mmdropit_cpu`` directly: load it whatever runs first."""
    assert fused_cpu.load()


@pytest.mark.parametrize('dtype', DTYPES, ids=str)
@pytest.mark.parametrize('numel', SIZES)
@pytest.mark.parametrize('kind', KINDS)
def test_int8_codes_scales_and_rebuilt_values_equal_eager(dtype, numel, kind):
    values = kernel_input(numel, dtype, kind)
    codes, scales = torch.ops.mmdropit_cpu.quantize_int8(values)
    with eager_only():
        eager_codes, eager_scales = quantize(values)
        eager_rebuilt = dequantize(eager_codes, eager_scales, dtype)
    assert torch.equal(codes, eager_codes) and torch.equal(scales, eager_scales)
    rebuilt = torch.ops.mmdropit_cpu.dequantize_int8(codes, scales, dtype)
    assert rebuilt.dtype == dtype and torch.equal(rebuilt, eager_rebuilt)


def test_the_int8_codec_takes_the_fused_path():
    values = kernel_input(70_001, torch.float32, 'scaled')
    with torch.profiler.profile() as profile:
        codes, scales = quantize(values)
        dequantize(codes, scales, torch.float32)
    calls = {event.name for event in profile.events()}
    assert {'mmdropit_cpu::quantize_int8', 'mmdropit_cpu::dequantize_int8'} <= calls


class _OperatorNames(TorchDispatchMode):
    """Records the name of every operator dispatched under it."""

    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def test_under_a_dispatch_mode_the_codecs_stay_fused():
    """A memory meter is a dispatch mode: it must see the codecs as training runs them (one
    operator each way), not the eager operations' temporaries (three copies of a chunk)."""
    values = kernel_input(70_001, torch.float32, 'scaled')
    with _OperatorNames() as seen:
        codes, scales = quantize(values)
        rebuilt = dequantize(codes, scales, torch.float32)
    assert seen.names == ['mmdropit_cpu.quantize_int8.default',
                          'mmdropit_cpu.dequantize_int8.default']
    with eager_only():
        assert torch.equal(rebuilt, dequantize(*quantize(values), torch.float32))


def test_metered_a_checkpointed_compressed_gelu_holds_no_more_than_a_dense_one():
    """Inside a plain checkpoint a compressed GELU's recomputation holds its codes instead of
    its input: the meter's activation peak is no higher than the dense GELU's (measured with
    the eager codec's temporaries, the compressed one read 1,282,056 bytes to 1,179,656)."""
    torch.manual_seed(3)
    model = nn.Sequential(nn.Linear(32, 64), *[nn.Sequential(nn.Linear(64, 64), nn.GELU())
                                               for _ in range(8)], nn.Linear(64, 10))
    images, labels = torch.randn(256, 32), torch.randint(0, 10, (256,))
    checkpoint_run(model, 7, 8)

    def activation_peak() -> int:
        for _ in range(2):  # the second pass, warm
            with StepPeakMeter(model) as meter:
                nn.functional.cross_entropy(model(images), labels).backward()
            model.zero_grad(set_to_none=True)
        return meter.result.activation_peak_bytes

    dense = activation_peak()
    compress_activations(model[8], bits=8)
    assert activation_peak() <= dense


def test_on_fake_tensors_the_codecs_run_eagerly():
    """The fused operators have no fake implementation: traced, the eager operations run."""
    with FakeTensorMode() as fake:
        values = fake.from_tensor(kernel_input(1000, torch.float32, 'scaled'))
        codes, scales = quantize(values)
        rebuilt = dequantize(codes, scales, torch.float32)
    assert (codes.dtype, scales.numel(), rebuilt.shape) == (torch.int8, 32, values.shape)


@pytest.mark.parametrize('bits', [4, 2])
@pytest.mark.parametrize('dtype', DTYPES, ids=str)
@pytest.mark.parametrize('numel', SIZES)
@pytest.mark.parametrize('kind', KINDS)
def test_low_bit_groups_and_rebuilt_values_equal_eager(bits, dtype, numel, kind):
    values = kernel_input(numel, dtype, kind)
    packed, minimums, steps = torch.ops.mmdropit_cpu.quantize_low(values, bits, 1234)
    with eager_only():
        _, eager_minimums, eager_steps = quantize_low(values, bits)
        eager_rebuilt = dequantize_low(packed, minimums, steps, bits, numel, dtype)
    assert torch.equal(minimums, eager_minimums) and torch.equal(steps, eager_steps)
    rebuilt = torch.ops.mmdropit_cpu.dequantize_low(packed, minimums, steps, bits, numel, dtype)
    assert rebuilt.dtype == dtype and torch.equal(rebuilt, eager_rebuilt)


@pytest.mark.parametrize('bits', [4, 2])
@pytest.mark.parametrize('kind', KINDS)
def test_each_code_is_a_level_next_to_its_value(bits, kind):
    numel = 70_001
    values = kernel_input(numel, torch.float32, kind)
    packed, minimums, steps = torch.ops.mmdropit_cpu.quantize_low(values, bits, 99)
    codes = unpack_codes(packed, bits)[:numel].double()
    group_of = torch.arange(numel) // GROUP
    levels = (values.double() - minimums.double()[group_of]) / steps.double()[group_of]
    assert ((codes - levels).abs() < 1 + 1e-4).all()  # floor or ceiling, not further
    assert codes.max() <= 2**bits - 1
    fractions = levels - levels.floor()
    rounded_up = codes > levels.floor() + 0.5
    # a value a quarter of a step above a level is rounded up about a quarter of the time
    middle = (fractions > 0.2) & (fractions < 0.3)
    assert abs(rounded_up[middle].double().mean().item() - 0.25) < 0.05


def test_codes_depend_on_the_seed_alone():
    values = kernel_input(600_003, torch.float32, 'normal')
    first = torch.ops.mmdropit_cpu.quantize_low(values, 4, 7)
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        alone = torch.ops.mmdropit_cpu.quantize_low(values, 4, 7)
    finally:
        torch.set_num_threads(threads)
    assert all(torch.equal(a, b) for a, b in zip(first, alone))
    other_seed = torch.ops.mmdropit_cpu.quantize_low(values, 4, 8)
    assert not torch.equal(first[0], other_seed[0])


def test_the_codec_takes_the_fused_path_and_draws_a_new_seed_each_time():
    values = kernel_input(1000, torch.float32, 'normal')
    assert not torch.equal(quantize_low(values, 4)[0], quantize_low(values, 4)[0])
    with eager_only():
        eager = quantize_low(values, 4)
    fused = quantize_low(values, 4)
    assert not torch.equal(fused[0], eager[0])  # different random numbers, same groups
    assert torch.equal(fused[1], eager[1]) and torch.equal(fused[2], eager[2])


def test_bad_bits_are_refused_in_one_line():
    with pytest.raises(RuntimeError, match='bits must be 4 or 2, got 3'):
        torch.ops.mmdropit_cpu.quantize_low(torch.randn(10), 3, 0)
