"""CompiledPeaks: a decision's compiled step is measured on its second iteration (the first
traces and compiles it), once per bucket, and again only after a new decision is entered."""
from __future__ import annotations

import torch
from torch import nn

from mmdropit.engine.hooks.compiled_peaks import CompiledPeaks


def test_the_iteration_after_the_one_that_compiled_is_measured_once_per_decision():
    net = nn.Linear(8, 8)
    peaks = CompiledPeaks(net, None)

    def iteration(key: tuple) -> int | None:
        peaks.start(key)
        net(torch.randn(4, 8)).sum().backward()
        return peaks.stop()

    peaks.entered()  # the first decision
    assert iteration((4,)) is None  # compiles
    measured = iteration((4,))
    assert measured is not None and measured >= 2 * 72 * 4  # parameters and gradients
    peaks.entered()  # decided again (the caller has not kept the measurement)
    assert iteration((4,)) is None
    assert iteration((4,)) is not None
    peaks.measured[(4,)] = measured  # kept
    assert iteration((4,)) is None
    peaks.entered()  # another bucket
    assert [iteration((2,)), iteration((2,)) is not None] == [None, True]
