"""Whether the Triton kernels (DropIT's, the integer codecs') can run on a tensor, and
importing them once.

Triton ships with the CUDA builds of torch; the kernels are compiled by Triton itself the first
time each runs (no build step). Without Triton, one warning line says so and DropIT and the
codecs run their eager paths on the GPU.

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


def _imported(module: str, kernels: str, fallback: str) -> ModuleType | None:
    """The kernels' ``module`` in this package, or ``None`` with one warning line naming the
    ``kernels`` and their ``fallback`` when Triton cannot be imported."""
    try:
        return importlib.import_module(f'{__package__}.{module}')
    except ImportError as error:
        warnings.warn(f'mmdropit: {kernels} are not used: Triton cannot be imported ({error}); '
                      f'install the CUDA build of torch, which ships it. {fallback}',
                      stacklevel=3)
        return None


@functools.cache
def load() -> ModuleType | None:
    """DropIT's kernels' module (:mod:`.dropit_kernels`), or ``None`` with one warning line
    when Triton cannot be imported."""
    return _imported('dropit_kernels', "DropIT's fused GPU kernels",
                     'DropIT runs on the slower eager path meanwhile.')


@functools.cache
def load_codecs() -> ModuleType | None:
    """The integer codecs' kernels' module (:mod:`.codec_kernels`), or ``None`` with one
    warning line when Triton cannot be imported."""
    return _imported('codec_kernels', "the integer codecs' fused GPU kernels",
                     'The codecs run their slower eager PyTorch path meanwhile.')


def usable(x: torch.Tensor) -> bool:
    """Whether DropIT's Triton kernels can run on ``x`` (a CUDA tensor of a dtype in
    :data:`DTYPES` with fewer than 2**31 elements, Triton importable, fused kernels switched
    on)."""
    return _takes(x) and load() is not None


def codecs_usable(x: torch.Tensor) -> bool:
    """Whether the integer codecs' Triton kernels can run on ``x`` (as :func:`usable`: a CUDA
    tensor of a dtype in :data:`DTYPES`, fewer than 2**31 elements, Triton importable, fused
    kernels switched on). Their decoders take ``x`` as any float32 tensor of the codes."""
    return _takes(x) and load_codecs() is not None


def _takes(x: torch.Tensor) -> bool:
    return x.is_cuda and x.dtype in DTYPES and x.numel() <= _MAX_NUMEL and fused_enabled()
