"""Whether DropIT's Triton kernels can run on a tensor, and importing them once.

Triton ships with the CUDA builds of torch; the kernels are compiled by Triton itself the first
time each runs (no build step). Without Triton, one warning line says so and DropIT runs its
eager path on the GPU.

Example:
    >>> usable(torch.randn(4))  # a CPU tensor: the CPU extension's job
    False
"""
from __future__ import annotations

import functools
import importlib
import warnings
from types import ModuleType

import torch

from ..switch import fused_enabled

DTYPES = (torch.float32, torch.bfloat16, torch.float16)
"""Input dtypes the kernels take (float64 stays eager: its magnitudes do not fit float32)."""
_MAX_NUMEL = 2**31 - 1


@functools.cache
def load() -> ModuleType | None:
    """The kernels' module (:mod:`.dropit_kernels`), or ``None`` with one warning line when
    Triton cannot be imported."""
    try:
        return importlib.import_module(f'{__package__}.dropit_kernels')
    except ImportError as error:
        warnings.warn(f"mmdropit: DropIT's fused GPU kernels are not used: Triton cannot be "
                      f'imported ({error}); install the CUDA build of torch, which ships it. '
                      'DropIT runs on the slower eager path meanwhile.', stacklevel=2)
        return None


def usable(x: torch.Tensor) -> bool:
    """Whether the Triton kernels can run on ``x`` (a CUDA tensor of a dtype in :data:`DTYPES`
    with fewer than 2**31 elements, Triton importable, fused kernels switched on)."""
    return (x.is_cuda and x.dtype in DTYPES and x.numel() <= _MAX_NUMEL and fused_enabled()
            and load() is not None)
