"""Set-up for the whole test session (doctests and ``tests/``), loaded before any test module.

Without a GPU, Triton kernels (DropIT's, :mod:`mmdropit.kernels.cuda`) are checked in Triton's
interpreter on CPU tensors; it must be chosen before Triton is first imported.
"""
import os

import torch

if not torch.cuda.is_available():
    os.environ.setdefault('TRITON_INTERPRET', '1')
