"""Compile every Triton launch DropIT's host code makes, for a Hopper GPU, without one.

Triton's interpreter (how the tests run the kernels on a CPU) is plain Python and accepts code
that Triton's compiler rejects (types that change in a loop, unsupported operations). Here each
launch of :mod:`mmdropit.kernels.cuda.dropit_kernels` and
:mod:`mmdropit.kernels.cuda.codec_kernels`, recorded from the host code on CPU
tensors and not run, goes through Triton's compiler and ``ptxas`` for ``sm_90``, with the
argument types it was given and the specialisation Triton's launcher would make on a GPU
(pointers 16-byte aligned, integers divisible by 16 marked so: what lets it vectorise loads).
It must run without ``TRITON_INTERPRET``:

    env -u TRITON_INTERPRET python -m tests.helpers.compile_triton_kernels
    env -u TRITON_INTERPRET python -m tests.helpers.compile_triton_kernels --instructions

It prints one line per distinct kernel build and exits non-zero on the first that fails. With
``--instructions`` it prints instead, for ``keep_topk``, ``scatter_bitmask`` and
``keep_random`` on a DeiT-S
layer's input at batch 256 (19.4 M elements) in bfloat16 and float32, the instructions of each
kernel's main loop (one block of ``BLOCK`` elements, per thread) in the ``sm_90`` machine code
(``nvdisasm``; static: both sides of a branch inside the loop are counted): without a GPU, a
proxy for the time of a pass whose instructions, not its memory traffic, set the pace.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import torch

_POINTEE = {torch.float32: 'fp32', torch.bfloat16: 'bf16', torch.float16: 'fp16',
            torch.int8: 'i8', torch.int32: 'i32', torch.int64: 'i64', torch.uint8: 'u8'}
_HOPPER = ('cuda', 90, 32)  # backend, compute capability, warp size
_LAUNCH_OPTIONS = ('num_warps', 'num_stages', 'num_ctas',  # of the launch, not the kernel
                   'enable_fp_fusion')


def _type(value) -> str:
    if isinstance(value, torch.Tensor):
        return '*' + _POINTEE[value.dtype]
    if isinstance(value, bool):
        return 'i1'
    if isinstance(value, int):
        return 'i32' if -2**31 <= value < 2**31 else 'i64'
    if isinstance(value, float):
        return 'fp32'
    raise TypeError(f'no Triton type for {value!r}')


def _attrs(args: tuple) -> dict[tuple[int], list]:
    """The divisibility Triton's CUDA launcher specialises on: every tensor (CUDA allocations
    are aligned), and each integer argument divisible by 16."""
    return {(index,): [['tt.divisibility', 16]] for index, value in enumerate(args)
            if isinstance(value, torch.Tensor) or (
                isinstance(value, int) and not isinstance(value, bool) and value % 16 == 0)}


DEIT_S_INPUT = 256 * 197 * 384
"""Elements of a DeiT-S block's Linear input at batch 256 (the ``--instructions`` table)."""


def _loop_instructions(cubin: bytes) -> int:
    """Instructions of the longest loop (the span of a backward branch) in ``cubin``'s SASS."""
    import triton

    nvdisasm = Path(triton.__file__).parent / 'backends/nvidia/bin/nvdisasm'
    with tempfile.NamedTemporaryFile(suffix='.cubin') as file:
        file.write(cubin)
        file.flush()
        sass = subprocess.run([str(nvdisasm), '-c', file.name], capture_output=True, text=True,
                              check=True).stdout
    labels, instructions = {}, []
    for line in sass.splitlines():
        label = re.match(r'\s*(\.L_x_\d+):', line)
        if label:
            labels[label.group(1)] = len(instructions)
        elif re.match(r'\s+/\*[0-9a-f]{4,}\*/', line):
            instructions.append(line)
    spans = [0]
    for end, line in enumerate(instructions):
        target = re.search(r'BRA\s.*?(\.L_x_\d+)', line)
        if target and labels.get(target.group(1), end + 1) <= end:
            spans.append(end - labels[target.group(1)] + 1)
    return max(spans)


def _host_calls(kernels) -> None:
    """Every host function of the kernels' module, in each dtype and encoding."""
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        flat = torch.randn(70_001).to(dtype)
        for bitmask in (True, False):
            kernels.keep_topk(flat, 7_000, bitmask)
            kernels.keep_topk(flat, flat.numel(), bitmask)
            kernels.keep_random(flat, 7_000, bitmask, 10.0, None)
            kernels.keep_random(flat, flat.numel(), bitmask, 1.0, None)
            kernels.write_above(flat, torch.tensor([0.5]), torch.zeros(69, dtype=torch.int32),
                                bitmask)
        kernels.above_counts(flat, 0.5)
        kernels.scatter_bitmask(torch.zeros(8_751, dtype=torch.uint8), flat[:0], 70_001)
        # a full grid: the write and scatter programs add up next_power_of_2(PROGRAMS) counts
        numel = (kernels.PROGRAMS - 1) * kernels.BLOCK + 1
        full = torch.zeros(numel, dtype=dtype)
        for bitmask in (True, False):
            kernels.keep_topk(full, 7_000, bitmask)
            kernels.keep_topk(full, numel, bitmask)
            kernels.keep_random(full, 7_000, bitmask, 10.0, None)
        kernels.scatter_bitmask(torch.zeros((numel + 7) // 8, dtype=torch.uint8), full[:0], numel)


def _codec_host_calls(codecs) -> None:
    """Every host function of the activation codes' kernels, in each dtype, bit width and
    bounding, on a size that leaves a partial group."""
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        flat = torch.randn(1_001).to(dtype)
        codes, scales = codecs.quantize_int8(flat)
        codecs.dequantize_int8(codes, scales, dtype)
        for bits in (4, 2):
            packed, minimums, steps = codecs.quantize_low(flat, bits,
                                                          torch.zeros(1, dtype=torch.int64))
            codecs.dequantize_low(packed, minimums, steps, bits, flat.numel(), dtype)
        for bounded in (True, False):
            codecs.where_bits(flat, codecs.pack_between(flat, -1.0, 1.0, bounded))
        packed = codecs.bucket_codes(flat, torch.linspace(-3, 3, 15).to(dtype))
        codecs.scale_by_codes(flat, packed, torch.rand(16).to(dtype))


def main() -> int:
    if os.environ.get('TRITON_INTERPRET') == '1':
        print('run without TRITON_INTERPRET: the interpreter compiles nothing', file=sys.stderr)
        return 2
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    from mmdropit.kernels.cuda import codec_kernels, dropit_kernels
    from mmdropit.bench.triton_launches import recorded_launches

    instructions = '--instructions' in sys.argv[1:]
    with recorded_launches(dropit_kernels, run=False) as launches:
        if instructions:
            for dtype in (torch.bfloat16, torch.float32):
                flat = torch.empty(DEIT_S_INPUT, dtype=dtype)
                bits, values = dropit_kernels.keep_topk(flat, DEIT_S_INPUT // 10, True)
                dropit_kernels.scatter_bitmask(bits, values, DEIT_S_INPUT)
                dropit_kernels.keep_random(flat, DEIT_S_INPUT // 10, True, 10.0, None)
        else:
            _host_calls(dropit_kernels)
    with recorded_launches(codec_kernels, run=False) as codec_launches:
        if not instructions:
            _codec_host_calls(codec_kernels)
    built = set()
    for launch in launches.triton + codec_launches.triton:
        names = launch.kernel.arg_names
        constants = {name: value for name, value in launch.constants.items()
                     if name not in _LAUNCH_OPTIONS}
        options = {name: value for name, value in launch.constants.items()
                   if name in _LAUNCH_OPTIONS}
        signature = {name: _type(value) for name, value in zip(names, launch.args)}
        signature.update({name: 'constexpr' for name in constants})
        attrs = _attrs(launch.args)
        key = (launch.name, tuple(signature.items()), tuple(launch.constants.items()),
               tuple(attrs))
        if key in built:
            continue
        built.add(key)
        source = ASTSource(fn=launch.kernel, signature=signature, constexprs=constants,
                           attrs=attrs)
        try:
            compiled = triton.compile(source, target=GPUTarget(*_HOPPER), options=options)
        except Exception as error:  # noqa: BLE001 (the compiler's own error, reported whole)
            print(f'FAILED {launch.name} {signature} {launch.constants}:\n{error}')
            return 1
        if instructions:
            dtype = next((str(value.dtype).removeprefix('torch.') for value in launch.args
                          if isinstance(value, torch.Tensor) and value.is_floating_point()),
                         'bitmask')
            shown = {name: value for name, value in constants.items()
                     if name in ('PASS', 'TIES', 'BITMASK', 'DRAWN')}
            print(f'{launch.name} {dtype} {shown}: '
                  f'{_loop_instructions(compiled.asm["cubin"])} instructions a block')
        else:
            print(f'compiled {launch.name} {launch.constants} {signature}')
    print(f'{len(built)} kernel builds compiled for sm_{_HOPPER[1]}')
    return 0


if __name__ == '__main__':
    sys.exit(main())
