"""Load MMEngine checkpoints under torch's safe (``weights_only=True``) unpickler.

Since torch 2.6, ``torch.load`` refuses any Python object it was not told is safe, and
MMEngine 0.10.7 writes some into every checkpoint (the message hub's ``HistoryBuffer``,
numpy arrays and scalars of logged values), so ``resume`` and ``load_from`` fail. Rather
than turning the safe loader off, this shim allow-lists exactly what MMEngine writes:

- ``HistoryBuffer`` and the numpy array / scalar / dtype reconstructors;
- ``getattr``, which ``HistoryBuffer`` pickles to name its statistics methods
  (``getattr(HistoryBuffer, 'mean')``). A general ``getattr`` would widen what a malicious
  file can reach, so the allow-listed one answers only those lookups and refuses the rest.

A checkpoint holding anything else still fails in torch, with torch's explanation.
"""
from __future__ import annotations

import pickle
from typing import Any

import numpy as np
import torch

try:
    from numpy._core import multiarray
except ImportError:  # numpy 1.x
    from numpy.core import multiarray


def _history_buffer_methods() -> dict[str, Any]:
    from mmengine.logging.history_buffer import HistoryBuffer

    HistoryBuffer()  # registers the default statistics methods on the class
    return dict(HistoryBuffer._statistics_methods)


def history_buffer_getattr(owner: Any, name: str) -> Any:
    """``getattr`` limited to ``HistoryBuffer``'s registered statistics methods.

    Raises:
        pickle.UnpicklingError: any other lookup.
    """
    from mmengine.logging.history_buffer import HistoryBuffer

    methods = _history_buffer_methods()
    if owner is HistoryBuffer and name in methods:
        return methods[name]
    raise pickle.UnpicklingError(
        f'refusing getattr({owner!r}, {name!r}) while loading a checkpoint: only '
        f'HistoryBuffer statistics methods {sorted(methods)} are allowed')


def mmengine_checkpoint_globals() -> list:
    """What MMEngine 0.10.7 checkpoints are made of, beyond tensors and builtins."""
    from mmengine.logging.history_buffer import HistoryBuffer

    numpy_dtypes = [type(np.dtype(kind)) for kind in (
        np.bool_, np.uint8, np.int8, np.int16, np.int32, np.int64,
        np.float16, np.float32, np.float64)]
    # numpy 2 pickles these as numpy._core.multiarray.*, numpy 1 as numpy.core.multiarray.*
    reconstructors = [(function, f'{package}.multiarray.{function.__name__}')
                      for function in (multiarray._reconstruct, multiarray.scalar)
                      for package in ('numpy._core', 'numpy.core')]
    return [
        HistoryBuffer,
        (history_buffer_getattr, 'builtins.getattr'),
        *reconstructors,
        np.ndarray,
        np.dtype,
        *numpy_dtypes,
    ]


def install() -> None:
    """Allow-list MMEngine's checkpoint contents for ``torch.load(weights_only=True)``."""
    torch.serialization.add_safe_globals(mmengine_checkpoint_globals())
