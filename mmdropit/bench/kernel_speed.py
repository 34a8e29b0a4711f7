"""How fast DropIT's kernels run on real layer inputs, beside the device's copy and the layer's GEMM.

For the inputs of a few DeiT-S and ResNet-50 layers (their shapes taken from the timm models by
forward hooks at batch 1 on the CPU, then scaled to each batch), in each dtype, this times:

- ``keep_topk``: the fused selection and encoding at gamma 0.9 (the Triton kernels on a GPU,
  the C++ extension on the CPU when built; the eager path where no fused kernel runs, the
  ``path`` column says which);
- ``keep_topk-eager``: the eager path the fused kernels are tested against (on a GPU it runs with
  no host sync since issue 37);
- ``keep_random`` / ``keep_random-eager``: the ``random`` strategy's fused selection (drawn
  keys, four histogram passes that read nothing, the write) and its eager draw (a permutation);
  on a GPU in bf16 only (its keys do not depend on the dtype; the stage has 60 s);
- ``scatter_bitmask``: rebuilding the dense input from the bitmask and the values;
- ``int8-encode`` / ``int8-decode``, ``int4-encode`` / ``int4-decode``, ``gelu-codes`` /
  ``gelu-scale``: the codec kernels of ``mmdropit/kernels/cuda/codec_kernels.py``
  (``quantize_int8`` / ``dequantize_int8``, ``quantize_low`` / ``dequantize_low`` at 4 bits, the
  lean GELU's ``bucket_codes`` / ``scale_by_codes``, the layer's input standing in for the
  gradient) when that module is there (a line says so when it is not);
- ``copy``: ``torch.empty_like(x).copy_(x)``, the device's copy bandwidth on the same bytes;
- ``gemm``: the layer's forward Linear / convolution with its real weight shape.

On a GPU a second table (measured first, in a few seconds) takes the Triton ``keep_topk`` and
``scatter_bitmask`` apart on the DeiT-S inputs at ``--launch-batch`` (256): each launch
(histogram passes, count, write; popcount, scatter) recorded once, then replayed alone in its
order, round after round (the histogram workspace zeroed before each round, as a call finds
it), and timed: its time, the input's bytes over it (``input GB/s``: one read of the input at
bandwidth is about half the copy's time) and its time over the input's copy (``x copy``). What
it checks: the instruction counts of ``python -m tests.helpers.compile_triton_kernels
--instructions`` (docs/dropit.md).

On a GPU each is timed with CUDA events (warm-up, then the median of ``--reps`` >= 8 runs, each
behind a short device sleep so that the host's launch time is not counted: see :class:`Timer`);
on the CPU with ``time.perf_counter``. ``GB/s`` is the bytes of the tensors a kernel reads and writes
(its inputs and outputs, each once) over its median time; ``x copy`` that bandwidth over the
copy's (1.0: as fast as a copy; the selection reads its input more than once, so it lands below);
``x gemm`` the kernel's time over the layer's GEMM. Inputs of batch 64 in bf16 fit in an H100's
50 MB L2 cache, so their bandwidths (the copy's too) can exceed the memory's.

Run ``python -m mmdropit.bench.kernel_speed OUT`` (``OUT/kernel_speed.{json,md}``; meant to take
well under 60 s on an H100); ``--device cpu --quick`` runs batch 1 in fp32 with two timed runs,
where the table forms but the figures mean little.

Example:
    >>> LAYERS['deit_small']
    ['blocks.0.attn.qkv', 'blocks.0.mlp.fc2']
"""
from __future__ import annotations

import argparse
import importlib
import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from types import ModuleType

import torch
import torch.nn.functional as F
from torch import nn

from ..codecs.derivative_codes import derivative_table
from ..common.timing import seconds_of
from ..dropit.compact import encode, scatter_kept
from ..dropit.strategies import kept_count, mink, random_scale, select
from ..kernels import fused_ops
from ..reporting.provenance import provenance, provenance_markdown
from .triton_launches import Launch, recorded_launches

GAMMA = 0.9
DTYPES = {'bf16': torch.bfloat16, 'fp32': torch.float32}
LAYERS = {
    'deit_small': ['blocks.0.attn.qkv',  # tokens 197 x dim 384
                   'blocks.0.mlp.fc2'],  # tokens 197 x MLP hidden 1536
    'resnet50': ['layer1.0.conv2',  # 64 x 56 x 56, 3x3
                 'layer2.0.conv3',  # 128 x 28 x 28, 1x1
                 'layer3.0.conv2',  # 256 x 28 x 28, 3x3 stride 2
                 'layer4.0.conv1'],  # 1024 x 14 x 14, 1x1
}
"""The layers timed per model: the DeiT-S block's two input widths; ResNet-50 convolutions
from each stage."""
TIMM_ARCH = {'deit_small': 'deit_small_patch16_224', 'resnet50': 'resnet50'}
LAUNCH_MODEL = 'deit_small'
"""The model whose layer inputs get the launch-by-launch table."""
HOST_AHEAD_CYCLES = 1_000_000
"""GPU clock cycles a timed round waits behind (about 0.5 ms at 2 GHz): more than the host takes
to launch a round (a Triton launch costs tens of microseconds on the host, ``keep_topk`` four to
six of them)."""


@dataclass(frozen=True)
class LayerInput:
    """A layer's input shape at batch 1 and the forward GEMM it runs."""

    model: str
    name: str
    shape: tuple[int, ...]
    gemm: Callable[[torch.Tensor, torch.Tensor], torch.Tensor]
    weight_shape: tuple[int, ...]


def _gemm_of(module: nn.Module) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    if isinstance(module, nn.Linear):
        return F.linear
    return lambda x, weight: F.conv2d(x, weight, None, module.stride, module.padding,
                                      module.dilation, module.groups)


def layer_inputs(model_name: str) -> list[LayerInput]:
    """The chosen layers of the timm model: input shapes at batch 1 (forward hooks on the CPU)
    and their GEMMs."""
    import timm

    model = timm.create_model(TIMM_ARCH[model_name], pretrained=False).eval()
    modules = dict(model.named_modules())
    found: dict[str, LayerInput] = {}

    def hook(name: str) -> Callable:
        def record(module: nn.Module, args: tuple) -> None:
            found[name] = LayerInput(model_name, name, tuple(args[0].shape), _gemm_of(module),
                                     tuple(module.weight.shape))
        return record

    handles = [modules[name].register_forward_pre_hook(hook(name)) for name in LAYERS[model_name]]
    try:
        with torch.no_grad():
            model(torch.zeros(1, 3, 224, 224))
    finally:
        for handle in handles:
            handle.remove()
    return [found[name] for name in LAYERS[model_name]]


def dropit_triton_kernels() -> ModuleType | None:
    """``mmdropit.kernels.cuda.dropit_kernels``, or ``None`` where Triton cannot be imported."""
    try:
        return importlib.import_module('mmdropit.kernels.cuda.dropit_kernels')
    except ImportError:
        return None


def codec_kernels() -> ModuleType | None:
    """``mmdropit.kernels.cuda.codec_kernels`` with ``quantize_int8`` / ``dequantize_int8``, or
    ``None`` when it is absent or lacks them."""
    try:
        module = importlib.import_module('mmdropit.kernels.cuda.codec_kernels')
    except ImportError:
        return None
    needed = ('quantize_int8', 'dequantize_int8')
    return module if all(hasattr(module, name) for name in needed) else None


class Timer:
    """Median times of functions on a device, after ``warmup`` untimed rounds: CUDA events on a
    GPU, each round enqueued behind a device sleep of :data:`HOST_AHEAD_CYCLES` (so the host has
    enqueued its launches before the device reaches them, and their launch time on the host is
    not counted); ``perf_counter`` on the CPU."""

    def __init__(self, device: torch.device, warmup: int, reps: int) -> None:
        self.device, self.warmup, self.reps = device, warmup, reps

    def seconds(self, function: Callable[[], object]) -> float:
        """The median over ``reps`` runs of ``function``, in seconds."""
        return self.each([function])[0]

    def each(self, functions: Sequence[Callable[[], object]],
             before: Callable[[], object] | None = None) -> list[float]:
        """The median time of each of ``functions``, run in their order after ``before`` (not
        timed) in each of ``reps`` rounds, in seconds."""
        for _ in range(self.warmup):
            for function in (before, *functions) if before else functions:
                function()
        if self.device.type != 'cuda':
            times = []
            for _ in range(self.reps):
                if before:
                    before()
                times.append([seconds_of(function, self.device) for function in functions])
        else:
            events = [[(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True))
                       for _ in functions] for _ in range(self.reps)]
            torch.cuda.synchronize(self.device)
            for round_events in events:
                if before:
                    before()
                torch.cuda._sleep(HOST_AHEAD_CYCLES)
                for function, (start, end) in zip(functions, round_events):
                    start.record()
                    function()
                    end.record()
            torch.cuda.synchronize(self.device)
            times = [[start.elapsed_time(end) / 1e3 for start, end in round_events]
                     for round_events in events]
        return [statistics.median(round_times[index] for round_times in times)
                for index in range(len(functions))]


def _bytes(*tensors: torch.Tensor) -> int:
    return sum(t.numel() * t.element_size() for t in tensors)


@dataclass
class Row:
    """One kernel on one layer input: its time and bandwidth beside the copy's and the GEMM's."""

    model: str
    layer: str
    batch: int
    dtype: str
    shape: tuple[int, ...]
    kernel: str
    path: str
    ms: float
    gbps: float
    copy_gbps: float
    gemm_ms: float

    @property
    def of_copy(self) -> float:
        """Bandwidth as a share of the copy's."""
        return self.gbps / self.copy_gbps

    @property
    def of_gemm(self) -> float:
        """Time as a multiple of the layer's GEMM."""
        return self.ms / self.gemm_ms


@dataclass
class LaunchRow:
    """One Triton launch of ``keep_topk`` or ``scatter_bitmask`` on one layer input, timed
    alone."""

    model: str
    layer: str
    batch: int
    dtype: str
    numel: int
    launch: str
    us: float
    input_gbps: float
    copy_us: float

    @property
    def of_copy(self) -> float:
        """Time as a multiple of the input's copy (a read of the input at bandwidth: ~0.5)."""
        return self.us / self.copy_us


def launch_rows(layer: LayerInput, batch: int, dtype_name: str, timer: Timer,
                kernels: ModuleType) -> list[LaunchRow]:
    """``keep_topk`` at gamma 0.9 in the bitmask encoding and ``scatter_bitmask`` on the
    layer's input, launch by launch (see the module)."""
    device, dtype = timer.device, DTYPES[dtype_name]
    x = torch.randn((batch, *layer.shape[1:]), device=device, dtype=dtype,
                    generator=torch.Generator(device).manual_seed(0))
    flat = x.view(-1)
    with recorded_launches(kernels) as selection:
        bits, values = kernels.keep_topk(flat, kept_count(flat.numel(), GAMMA), True)
    with recorded_launches(kernels) as rebuild:
        kernels.scatter_bitmask(bits, values, flat.numel())
    launches: list[Launch] = selection.triton + rebuild.triton
    histograms = next(launch.argument('hist_ptr') for launch in launches
                      if 'PASS' in launch.constants)
    seconds = timer.each([launch.replay for launch in launches], before=histograms.zero_)
    copy_us = timer.seconds(lambda: torch.empty_like(x).copy_(x)) * 1e6
    input_bytes = _bytes(flat)
    return [LaunchRow(layer.model, layer.name, batch, dtype_name, flat.numel(), launch.label,
                      time_s * 1e6, input_bytes / time_s / 1e9, copy_us)
            for launch, time_s in zip(launches, seconds)]


def launch_table(rows: Sequence[LaunchRow]) -> str:
    """The launch rows as a Markdown table."""
    lines = ['| model | layer | batch | dtype | elements | launch | us | input GB/s | copy us '
             '| x copy |', '|' + '---|' * 10]
    for row in rows:
        lines.append(f'| {row.model} | {row.layer} | {row.batch} | {row.dtype} | {row.numel} | '
                     f'{row.launch} | {row.us:.1f} | {row.input_gbps:.1f} | {row.copy_us:.1f} '
                     f'| {row.of_copy:.2f} |')
    return '\n'.join(lines)


def _kernels(x: torch.Tensor, codec: ModuleType | None) -> list[tuple[str, str, Callable]]:
    """``(kernel, path, function)`` for each kernel timed on ``x``; each function returns the
    tensors it read and wrote."""
    flat = x.view(-1)
    kept = kept_count(flat.numel(), GAMMA)
    fused = fused_ops(flat)

    def eager_keep() -> tuple[torch.Tensor, ...]:
        keep, _ = mink(flat, GAMMA)
        return (flat, *encode(flat, keep, 1.0, 'bitmask', kept))

    def eager_random() -> tuple[torch.Tensor, ...]:
        keep, scale = select('random', flat, GAMMA)
        return (flat, *encode(flat, keep, scale, 'bitmask', kept))

    bits, values = eager_keep()[1:]
    scale = random_scale(flat.numel(), kept)
    rows = [('keep_topk-eager', 'eager', eager_keep)]
    if fused is not None:
        rows.insert(0, ('keep_topk', 'fused',
                        lambda: (flat, *fused.keep_topk(flat, kept, True))))
    if not x.is_cuda or x.dtype == torch.bfloat16:  # on a GPU in bf16 alone: the stage's time
        if fused is not None:
            rows.append(('keep_random', 'fused',
                         lambda: (flat, *fused.keep_random(flat, kept, True, scale, None))))
        rows.append(('keep_random-eager', 'eager', eager_random))
    if fused is not None:
        rows.append(('scatter_bitmask', 'fused',
                     lambda: (bits, values, fused.scatter_bitmask(bits, values, flat.numel()))))
    else:
        rows.append(('scatter_bitmask', 'eager',
                     lambda: (bits, values, scatter_kept(bits, values, flat.numel(), 'bitmask'))))
    if codec is not None and x.is_cuda:
        rows += _codec_kernels(flat, codec)
    return rows


def _codec_kernels(flat: torch.Tensor, codec: ModuleType) -> list[tuple[str, str, Callable]]:
    """The rows of the activation codes' Triton kernels on ``flat``: int8 and 4-bit encoding
    and decoding, and the lean GELU's derivative codes and the gradient they scale."""
    codes, scales = codec.quantize_int8(flat)
    seed = torch.zeros(1, dtype=torch.int64, device=flat.device)
    packed, minimums, steps = codec.quantize_low(flat, 4, seed)
    table = derivative_table('gelu')
    boundaries = table.boundaries.to(flat.device, flat.dtype)
    slopes = table.values.to(flat.device, flat.dtype)
    derivative_codes = codec.bucket_codes(flat, boundaries)
    return [
        ('int8-encode', 'fused', lambda: (flat, *codec.quantize_int8(flat))),
        ('int8-decode', 'fused', lambda: (
            codes, scales, codec.dequantize_int8(codes, scales, flat.dtype))),
        ('int4-encode', 'fused', lambda: (flat, *codec.quantize_low(flat, 4, seed))),
        ('int4-decode', 'fused', lambda: (packed, minimums, steps, codec.dequantize_low(
            packed, minimums, steps, 4, flat.numel(), flat.dtype))),
        ('gelu-codes', 'fused', lambda: (flat, codec.bucket_codes(flat, boundaries))),
        ('gelu-scale', 'fused', lambda: (flat, derivative_codes, codec.scale_by_codes(
            flat, derivative_codes, slopes))),
    ]


def measure(layer: LayerInput, batch: int, dtype_name: str, timer: Timer,
            codec: ModuleType | None) -> list[Row]:
    """The rows of one layer input at one batch and dtype."""
    device, dtype = timer.device, DTYPES[dtype_name]
    generator = torch.Generator(device).manual_seed(0)
    shape = (batch, *layer.shape[1:])
    x = torch.randn(shape, device=device, dtype=dtype, generator=generator)
    weight = torch.randn(layer.weight_shape, device=device, dtype=dtype, generator=generator)
    copy_seconds = timer.seconds(lambda: torch.empty_like(x).copy_(x))
    copy_gbps = 2 * _bytes(x) / copy_seconds / 1e9
    gemm_ms = timer.seconds(lambda: layer.gemm(x, weight)) * 1e3
    rows = []
    for kernel, path, function in _kernels(x, codec):
        seconds = timer.seconds(function)
        moved = _bytes(*function())
        rows.append(Row(layer.model, layer.name, batch, dtype_name, shape, kernel, path,
                        seconds * 1e3, moved / seconds / 1e9, copy_gbps, gemm_ms))
    return rows


def table(rows: Sequence[Row]) -> str:
    """The rows as a Markdown table."""
    lines = ['| model | layer | batch | dtype | input | kernel | path | ms | GB/s | copy GB/s '
             '| x copy | gemm ms | x gemm |', '|' + '---|' * 13]
    for row in rows:
        lines.append(
            f'| {row.model} | {row.layer} | {row.batch} | {row.dtype} | '
            f'{"x".join(map(str, row.shape))} | {row.kernel} | {row.path} | {row.ms:.3f} | '
            f'{row.gbps:.1f} | {row.copy_gbps:.1f} | {row.of_copy:.2f} | {row.gemm_ms:.3f} | '
            f'{row.of_gemm:.2f} |')
    return '\n'.join(lines)


def write(out: Path, record: dict, device: torch.device, rows: Sequence[Row],
          launches: Sequence[LaunchRow] = ()) -> None:
    """``out/kernel_speed.md`` (the run, the table and the launch table when there is one) and
    ``out/kernel_speed.json``."""
    out.mkdir(parents=True, exist_ok=True)
    launch_part = ('\n## keep_topk and scatter_bitmask, launch by launch\n\n'
                   + launch_table(launches) + '\n') if launches else ''
    (out / 'kernel_speed.md').write_text(
        '# DropIT kernel speed\n\n' + provenance_markdown(record) + '\n\n' + table(rows) + '\n'
        + launch_part)
    (out / 'kernel_speed.json').write_text(json.dumps(
        {'run': record, 'device': str(device), 'gamma': GAMMA,
         'rows': [asdict(row) | {'of_copy': row.of_copy, 'of_gemm': row.of_gemm}
                  for row in rows],
         'launches': [asdict(row) | {'of_copy': row.of_copy} for row in launches]}, indent=1))


def main(argv: Sequence[str] | None = None) -> list[Row]:
    """Command line: time the kernels, print the table, write ``OUT/kernel_speed.{json,md}``
    (after each layer, so a run stopped by a time limit keeps what it measured)."""
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('out', type=Path, help='folder for kernel_speed.json and .md')
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--models', nargs='+', default=list(LAYERS), choices=list(LAYERS))
    parser.add_argument('--batches', nargs='+', type=int, default=[64, 256])
    parser.add_argument('--dtypes', nargs='+', default=list(DTYPES), choices=list(DTYPES))
    parser.add_argument('--warmup', type=int, default=3)
    parser.add_argument('--reps', type=int, default=10, help='timed runs (median), >= 8')
    parser.add_argument('--launch-batch', type=int, default=256,
                        help=f'batch of the {LAUNCH_MODEL} inputs timed launch by launch (GPU)')
    parser.add_argument('--quick', action='store_true',
                        help='batch 1, fp32, one warm-up, two timed runs (a smoke test)')
    args = parser.parse_args(argv)
    if args.quick:
        args.batches, args.dtypes, args.warmup, args.reps = [1], ['fp32'], 1, 2
    elif args.reps < 8:
        parser.error('--reps must be at least 8 (use --quick for a smoke test)')
    device = torch.device(args.device)
    timer = Timer(device, args.warmup, args.reps)
    codec = codec_kernels() if device.type == 'cuda' else None
    if device.type == 'cuda' and codec is None:
        print('codec kernels: mmdropit/kernels/cuda/codec_kernels.py (quantize_int8, '
              'dequantize_int8) not there: skipped')
    record = provenance(None if argv is None else
                        ['-m', 'mmdropit.bench.kernel_speed', *argv])
    rows: list[Row] = []
    launches: list[LaunchRow] = []
    inputs = {model: layer_inputs(model) for model in args.models}
    kernels = dropit_triton_kernels() if device.type == 'cuda' else None
    with torch.no_grad():  # the launch table first: a few seconds, kept if the stage is cut
        if kernels is not None and LAUNCH_MODEL in args.models:
            for layer in inputs[LAUNCH_MODEL]:
                for dtype_name in args.dtypes:
                    launches += launch_rows(layer, args.launch_batch, dtype_name, timer, kernels)
            write(args.out, record, device, rows, launches)
            print(launch_table(launches))
        for model in args.models:
            for layer in inputs[model]:
                for batch in args.batches:
                    for dtype_name in args.dtypes:
                        rows += measure(layer, batch, dtype_name, timer, codec)
                write(args.out, record, device, rows, launches)  # kept if the stage is cut
    print(table(rows))
    return rows


if __name__ == '__main__':
    main()
