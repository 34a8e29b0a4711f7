"""trial_peaks: one CPU pass gives the peaks with and without gradients held, as two passes
measure them."""
import pytest
import torch
from torch import nn

from mmdropit.memory import trial_peak, trial_peaks


def _frozen_stem_mlp() -> nn.Module:
    net = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.Linear(256, 256), nn.GELU(),
                        nn.Linear(256, 10))
    net[0].requires_grad_(False)
    return net


def _conv_batchnorm() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.Conv2d(16, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(16, 10))


def _wide_weights() -> nn.Module:
    """Parameters far larger than the activations: the step without held gradients peaks at
    its end, when the gradients exist; with them held, the peak is elsewhere."""
    return nn.Sequential(nn.Linear(512, 1024), nn.ReLU(), nn.Linear(1024, 512), nn.ReLU(),
                         nn.Linear(512, 10))


@pytest.mark.parametrize('build, inputs', [
    (_frozen_stem_mlp, (32, 64)),
    (_conv_batchnorm, (8, 3, 16, 16)),
    (_wide_weights, (2, 512)),
])
@pytest.mark.parametrize('optimizer', [None, 'adamw'])
def test_one_pass_gives_both_peaks_as_two_passes_measure_them(build, inputs, optimizer):
    torch.manual_seed(0)
    net = build()
    opt = torch.optim.AdamW(p for p in net.parameters() if p.requires_grad) \
        if optimizer else None
    x = torch.randn(*inputs)

    def run():
        net(x).square().mean().backward()

    peaks = trial_peaks(run, net, opt)
    assert peaks.fresh == trial_peak(run, net, opt, gradients_held=False)
    assert peaks.held == trial_peak(run, net, opt, gradients_held=True)
    assert peaks.held > peaks.fresh
    assert all(p.grad is None for p in net.parameters())


def test_a_pass_that_runs_out_of_memory_runs_once():
    """Out of memory without gradients held, it would run out with them held too."""
    net, runs = _frozen_stem_mlp(), []

    def run():
        runs.append(1)
        net(torch.randn(4, 64)).sum()
        raise torch.OutOfMemoryError('the device is full')

    peaks = trial_peaks(run, net)
    assert (peaks.fresh, peaks.held, len(runs)) == (None, None, 1)
