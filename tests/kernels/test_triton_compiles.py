"""DropIT's Triton kernels compile for a Hopper GPU as the host code launches them (Triton's
compiler and ``ptxas``, no GPU needed): the interpreter the other kernel tests run in accepts
code that the compiler rejects, which only a GPU session would otherwise find."""
from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip('triton', reason='Triton ships with the CUDA build of torch')
ROOT = Path(__file__).resolve().parents[2]


def test_every_launch_compiles_for_sm90():
    environment = {key: value for key, value in os.environ.items() if key != 'TRITON_INTERPRET'}
    done = subprocess.run([sys.executable, '-m', 'tests.helpers.compile_triton_kernels'],
                          cwd=ROOT, env=environment, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert 'kernel builds compiled for sm_90' in done.stdout


def test_the_instruction_table_counts_every_pass_of_a_selection_and_a_rebuild():
    """``--instructions``: each kernel of ``keep_topk``, ``scatter_bitmask`` and
    ``keep_random`` gets the size of its main loop in the ``sm_90`` machine code (a loop past
    the first 64 KiB of code counted too), in bfloat16 and float32; ``keep_random`` makes four
    histogram passes in both."""
    environment = {key: value for key, value in os.environ.items() if key != 'TRITON_INTERPRET'}
    done = subprocess.run([sys.executable, '-m', 'tests.helpers.compile_triton_kernels',
                           '--instructions'], cwd=ROOT, env=environment, capture_output=True,
                          text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    counts = re.findall(r'^(_\w+_kernel) (\w+) (.*): (\d+) instructions a block$', done.stdout,
                        re.MULTILINE)
    passes = [(dtype, "'DRAWN': True" in constants) for name, dtype, constants, _ in counts
              if name == '_digit_histogram_kernel']
    assert passes.count(('bfloat16', False)) == 2, done.stdout
    assert passes.count(('float32', False)) == 4, done.stdout
    assert passes.count(('bfloat16', True)) == passes.count(('float32', True)) == 4, done.stdout
    assert {name for name, _, _, _ in counts} == {
        '_digit_histogram_kernel', '_write_kernel', '_popcount_kernel',
        '_scatter_kernel'}, done.stdout
    assert all(int(size) > 100 for _, _, _, size in counts), done.stdout
