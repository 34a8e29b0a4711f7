"""DropIT's eager path reads nothing back from the device for the fixed-count strategies
(``mink``, ``random``): on a GPU each read (``.item()``, ``nonzero``'s data-dependent size) stops
the host until the device catches up (issue 37). On the CPU the ATen operators a layer runs are
recorded and the reading ones refused; on a GPU, CUDA's sync debug mode refuses them itself."""
from __future__ import annotations

import warnings

import pytest
import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode

from mmdropit.bench.host_cost import SYNCING
from mmdropit.dropit import ops, strategies
from mmdropit.dropit.config import DropITConfig
from mmdropit.kernels.switch import eager_only

INDEXING = frozenset({'aten::index', 'aten::index_put', 'aten::index_put_',
                      'aten::_index_put_impl_'})
"""Operators that read a boolean index's true count back (a ``nonzero`` inside the kernel)."""
DROPIT_OPERATORS = {'mmdropit::keep': ops._keep, 'mmdropit::unkeep': ops._unkeep}
"""DropIT's custom operators (called under a dispatch mode) and their bodies, recorded inside."""
FEATURES = 512
LARGE_ROWS = 8 * strategies.SAMPLE_SIZE // FEATURES + 8
"""Rows of an input past the size where ``mink`` brackets its threshold with a sample (on the
CPU)."""


def _reads_back(func, args) -> bool:
    name = func.overloadpacket._qualified_op_name
    if name in SYNCING or name == 'aten::item':
        return True
    indices = args[1] if name in INDEXING and len(args) > 1 else ()
    return any(isinstance(index, torch.Tensor) and index.dtype == torch.bool
               for index in indices or ())


class ReadsRecorded(TorchDispatchMode):
    """Records the ATen operators run under it that would wait for a GPU, inside DropIT's
    custom operators too."""

    def __init__(self) -> None:
        super().__init__()
        self.reads: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        body = DROPIT_OPERATORS.get(func.overloadpacket._qualified_op_name)
        if body is not None:
            with self:  # the operator's kernel would run its body unrecorded
                return body(*args, **(kwargs or {}))
        if _reads_back(func, args):
            self.reads.append(str(func))
        return func(*args, **(kwargs or {}))


def _eager_step_reads(strategy: str, rows: int, device: str = 'cpu') -> list[str]:
    """The reading operators of one eager forward and backward pass of a DropIT Linear."""
    torch.manual_seed(0)
    layer = nn.Linear(FEATURES, 8, device=device)
    DropITConfig(gamma=0.9, strategy=strategy, exclude=[]).apply(layer)
    x = torch.randn(rows, FEATURES, device=device)
    with eager_only():
        layer(x).sum().backward()  # first use: plans and caches fill
        with ReadsRecorded() as recorded:
            layer(x).sum().backward()
    return recorded.reads


@pytest.fixture
def device_path(monkeypatch):
    """This CPU takes the path a GPU takes (no sampled bracket, whose check reads counts; a
    warning where ``mink_approx`` reads back)."""
    monkeypatch.setattr(strategies, 'host_reads_are_free', lambda device: False)
    monkeypatch.setattr(ops, 'host_reads_are_free', lambda device: False)


@pytest.mark.parametrize('rows', [4, LARGE_ROWS])
@pytest.mark.parametrize('strategy', ['mink', 'random'])
def test_the_fixed_count_eager_path_reads_nothing_back(device_path, strategy, rows):
    assert _eager_step_reads(strategy, rows) == []


def test_mink_approx_reads_nothing_back_on_inputs_under_its_sample():
    assert _eager_step_reads('mink_approx', 4) == []


def test_mink_approx_reads_its_data_dependent_count_back_once(device_path):
    with pytest.warns(UserWarning, match="'mink_approx' reads its kept count back .* "
                                         "strategy='mink' selects exactly"):
        assert _eager_step_reads('mink_approx', LARGE_ROWS) == ['aten.nonzero.default']


def test_mink_approx_does_not_warn_where_reading_back_is_free():
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        _eager_step_reads('mink_approx', LARGE_ROWS)


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')
@pytest.mark.parametrize('strategy', ['mink', 'random'])
def test_the_eager_path_never_waits_for_the_gpu(strategy):
    torch.manual_seed(0)
    layer = nn.Linear(FEATURES, 8, device='cuda')
    DropITConfig(gamma=0.9, strategy=strategy, exclude=[]).apply(layer)
    x = torch.randn(LARGE_ROWS, FEATURES, device='cuda')
    with eager_only():
        layer(x).sum().backward()  # first use: plans, caches and the generator are made
        torch.cuda.synchronize()
        torch.cuda.set_sync_debug_mode('error')
        try:
            layer(x).sum().backward()
        finally:
            torch.cuda.set_sync_debug_mode('default')
