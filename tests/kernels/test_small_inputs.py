"""The fused ``keep_topk`` selects among the keys of small inputs (at most 2,048 elements)
instead of building histograms: bit-identical to the eager ``mink`` on either side of that
size, for every dtype, ties and mostly-zero inputs."""
from __future__ import annotations

import shutil

import pytest
import torch

from mmdropit.dropit.compact import encode
from mmdropit.dropit.strategies import kept_count, mink
from mmdropit.kernels import cpu as fused_cpu
from tests.helpers.kernel_inputs import KINDS, kernel_input

pytestmark = pytest.mark.skipif(shutil.which('c++') is None, reason='no C++ compiler here')


@pytest.mark.parametrize('dtype', (torch.float32, torch.bfloat16, torch.float16, torch.float64),
                         ids=str)
@pytest.mark.parametrize('numel', (2, 16, 2047, 2048, 2049))
@pytest.mark.parametrize('kind', KINDS)
def test_keep_topk_of_a_small_input_equals_eager_mink(dtype, numel, kind):
    if not fused_cpu.load():
        pytest.skip('the fused CPU kernels are not built')
    x = kernel_input(numel, dtype, kind)
    for gamma in (0.5, 0.9, 0.99):
        keep, _ = mink(x, gamma)
        for encoding in ('bitmask', 'indices'):
            eager = encode(x, keep, 1.0, encoding)
            fused = torch.ops.mmdropit_cpu.keep_topk(x, kept_count(numel, gamma),
                                                     encoding == 'bitmask')
            assert torch.equal(fused[0], eager[0]), (gamma, encoding)
            assert torch.equal(fused[1], eager[1]), (gamma, encoding)
