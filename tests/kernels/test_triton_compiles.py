"""DropIT's Triton kernels compile for a Hopper GPU as the host code launches them (Triton's
compiler and ``ptxas``, no GPU needed): the interpreter the other kernel tests run in accepts
code that the compiler rejects, which only a GPU session would otherwise find."""
from __future__ import annotations

import os
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
