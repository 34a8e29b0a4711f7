"""Data pickles as Python 3 writes them load; a pickle that calls anything else does not."""
from __future__ import annotations

import io
import pickle

import numpy as np
import pytest

from mmdropit.data.safe_pickle import load_data_pickle
from mmdropit.errors import DataFormatError


@pytest.mark.parametrize('protocol', range(2, pickle.HIGHEST_PROTOCOL + 1))
def test_a_cifar_like_pickle_of_every_protocol_loads(protocol):
    """Protocol 5 rebuilds arrays with numpy's _frombuffer, protocol 2 bytes with
    _codecs.encode: both were refused as calls a data file should not make."""
    data = {b'data': np.arange(12, dtype=np.uint8).reshape(2, 6), b'labels': [3, 7],
            b'batch_label': b'training batch 1 of 5'}
    loaded = load_data_pickle(io.BytesIO(pickle.dumps(data, protocol=protocol)))
    assert np.array_equal(loaded[b'data'], data[b'data']) and loaded[b'labels'] == [3, 7]
    assert loaded[b'batch_label'] == data[b'batch_label']


def test_a_pickle_that_calls_something_else_is_refused():
    class Payload:
        def __reduce__(self):
            return (eval, ('1 + 1',))

    with pytest.raises(DataFormatError, match='calls builtins.eval'):
        load_data_pickle(io.BytesIO(pickle.dumps(Payload())), 'evil.pkl')
