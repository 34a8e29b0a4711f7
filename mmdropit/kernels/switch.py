"""The switch between DropIT's fused kernels and its eager path, for every device.

Setting ``MMDROPIT_FUSED=0``, or :func:`eager_only` around a step, keeps DropIT on the eager
PyTorch path (side-by-side comparisons in one process, or ruling the kernels out);
:func:`without_nodes` keeps DropIT's Linear and convolution and the lean ReLU / Hardtanh on
their Python autograd Functions, on the fused kernels (to measure what their C++ nodes save).

Example:
    >>> with eager_only():
    ...     fused_enabled()
    False
"""
from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator

_OFF = {'fused': False, 'nodes': False}
"""What is switched off in this process (by :func:`eager_only`, :func:`without_nodes`)."""


@contextlib.contextmanager
def _switched_off(name: str) -> Iterator[None]:
    before, _OFF[name] = _OFF[name], True
    try:
        yield
    finally:
        _OFF[name] = before


def eager_only() -> contextlib.AbstractContextManager[None]:
    """Keep DropIT on its eager path inside (a side-by-side comparison in one process)."""
    return _switched_off('fused')


def without_nodes() -> contextlib.AbstractContextManager[None]:
    """Run DropIT's Linear and convolution and the lean ReLU / Hardtanh as their Python
    autograd Functions inside, never as their C++ nodes."""
    return _switched_off('nodes')


def nodes_enabled() -> bool:
    """False inside :func:`without_nodes`."""
    return not _OFF['nodes']


def _environment_reader() -> Callable[[], object]:
    """Reads ``MMDROPIT_FUSED`` afresh at each call (a test may set it at any time), from the
    dictionary behind ``os.environ`` where there is one: ``os.environ.get`` encodes the name
    and decodes the value each time, ~1 us of host time, and DropIT asks twice a layer."""
    data, encode = getattr(os.environ, '_data', None), getattr(os.environ, 'encodekey', None)
    if not isinstance(data, dict) or encode is None:
        return lambda: os.environ.get('MMDROPIT_FUSED') == '0'
    key, off = encode('MMDROPIT_FUSED'), os.environ.encodevalue('0')
    return lambda: data.get(key) == off


_fused_off_by_environment = _environment_reader()


def fused_enabled() -> bool:
    """False inside :func:`eager_only` and when ``MMDROPIT_FUSED=0`` asks for the eager path."""
    return not _OFF['fused'] and not _fused_off_by_environment()
