"""Read a data pickle without running code: only what data formats hold may be rebuilt.

``pickle.load`` calls whatever a file names, so a crafted dataset file runs code the moment a
config points at it. :func:`load_data_pickle` rebuilds containers, strings, bytes and numbers
(which pickle builds without calling anything) and numpy arrays, and refuses every other
callable with a one-line error.

Example:
    >>> import io, pickle
    >>> import numpy as np
    >>> data = {'data': np.arange(6, dtype=np.uint8).reshape(2, 3), 'labels': [1, 2]}
    >>> load_data_pickle(io.BytesIO(pickle.dumps(data)))['data'].shape
    (2, 3)
    >>> class Payload:
    ...     def __reduce__(self):
    ...         return (print, ('this would run',))
    >>> try:
    ...     load_data_pickle(io.BytesIO(pickle.dumps(Payload())), 'evil.pkl')
    ... except DataFormatError as error:
    ...     print(str(error).split(';')[0])
    evil.pkl is not a plain data pickle: it calls builtins.print
"""
from __future__ import annotations

import pickle
from typing import BinaryIO

from ..errors import DataFormatError

ALLOWED = {
    ('numpy', 'ndarray'), ('numpy', 'dtype'),
    ('numpy.core.multiarray', '_reconstruct'), ('numpy._core.multiarray', '_reconstruct'),
    ('numpy.core.multiarray', 'scalar'), ('numpy._core.multiarray', 'scalar'),
    ('numpy.core.numeric', '_frombuffer'), ('numpy._core.numeric', '_frombuffer'),
    ('_codecs', 'encode'), ('collections', 'OrderedDict'),
}
"""The only callables a data pickle may name: how numpy arrays (also from a pickle of protocol
5, which keeps their bytes out of band), bytes written by Python 3 in protocol 2 and ordered
dicts are rebuilt."""


class _DataUnpickler(pickle.Unpickler):
    def __init__(self, stream: BinaryIO, name: str, **kwargs) -> None:
        super().__init__(stream, **kwargs)
        self.name = name

    def find_class(self, module: str, name: str) -> object:
        if (module, name) not in ALLOWED:
            raise DataFormatError(f'{self.name} is not a plain data pickle: it calls '
                                  f'{module}.{name}; refusing to load it (check where the file '
                                  'came from)')
        return super().find_class(module, name)


def load_data_pickle(stream: BinaryIO, name: str = 'the file',
                     encoding: str = 'latin1') -> object:
    """``pickle.load(stream, encoding=encoding)`` restricted to plain data and numpy arrays.

    Args:
        stream: The open binary file.
        name: How the error message names the file.
        encoding: How Python 2 strings are decoded (``'latin1'`` for CIFAR's release).

    Raises:
        DataFormatError: The pickle names any other callable.
    """
    return _DataUnpickler(stream, name, encoding=encoding).load()
