"""DropIT's C++ autograd nodes on a GPU: the Triton kernels registered as the CUDA
implementations of the CPU library's ``mmdropit_cpu::keep_topk``, ``mmdropit_cpu::keep_random``
and ``mmdropit_cpu::scatter_bitmask`` (DropIT's selection) and ``mmdropit_cpu::pack_between`` and
``mmdropit_cpu::where_bits`` (the lean activations' 1-bit masks).

The nodes (``kernels/cpu/dropit_linear.cpp``, ``dropit_conv.cpp``, ``lean_activation.cpp``)
call those operators through the dispatcher, so once a device's implementations are registered
they run there as on the CPU: the forward and backward pass of a DropIT Linear or convolution,
or of a lean ReLU, without a Python autograd Function, its context and the Python between its
operators, which a host-bound GPU step pays every layer (issue 37). The nodes are built with
the CPU library, so they run on a GPU only where that library is built (``make env``);
elsewhere the layers keep their Python Functions, with the same kernels.

Example:
    >>> node_ready() in (True, False)
    True
"""
from __future__ import annotations

import functools

import torch

from ..cpu import library as cpu_library
from .library import load, load_codecs


def register_kernels(dispatch_key: str) -> torch.library.Library:
    """Register the Triton ``keep_topk``, ``keep_random`` and ``scatter_bitmask``
    (:mod:`.dropit_kernels`),
    ``pack_between`` and ``where_bits`` (:mod:`.codec_kernels`) as the implementations of the
    CPU library's operators of those names for ``dispatch_key``.

    Args:
        dispatch_key: ``'CUDA'`` (what :func:`node_ready` registers), or ``'CPU'`` where
            Triton's interpreter runs the kernels on CPU tensors (the tests).

    Returns:
        The registration, in force until it is destroyed (``library._destroy()``) or
        collected.
    """
    kernels, codecs = load(), load_codecs()
    if kernels is None or codecs is None:
        raise RuntimeError('the Triton kernels cannot be imported')
    registration = torch.library.Library('mmdropit_cpu', 'IMPL')
    for module, names in ((kernels, ('keep_topk', 'keep_random', 'scatter_bitmask')),
                          (codecs, ('pack_between', 'where_bits'))):
        for name in names:
            registration.impl(name, getattr(module, name), dispatch_key)
    return registration


def node_ready() -> bool:
    """Whether the nodes can run on CUDA tensors: the CPU library built for these sources and
    loaded, and Triton importable; the first call registers the CUDA implementations."""
    return _cuda_registration() is not None


@functools.cache
def _cuda_registration() -> torch.library.Library | None:
    """The CUDA implementations, registered once (``None``: the nodes cannot run on a GPU)."""
    if cpu_library.why_not_loadable() is not None or load() is None or \
            load_codecs() is None or not cpu_library.load():
        return None
    return register_kernels('CUDA')
