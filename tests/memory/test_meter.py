"""The start/stop protocol shared by both meters (mmdropit.memory.meter.Meter)."""
import pytest
import torch
from torch import nn

from mmdropit.memory import SavedTensorMeter, StepPeakMeter


@pytest.mark.parametrize('make_meter', [SavedTensorMeter, StepPeakMeter],
                         ids=['saved', 'peak'])
def test_start_stop_and_errors(make_meter):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 32))

    def step() -> None:
        net(torch.randn(8, 64)).sum().backward()
        net.zero_grad(set_to_none=True)

    step()  # warm-up: every measured step below is then the same
    meter = make_meter(net)
    with pytest.raises(RuntimeError, match='no result'):
        meter.result
    with pytest.raises(RuntimeError, match='before start'):
        meter.stop()
    meter.start()
    with pytest.raises(RuntimeError, match='already running'):
        meter.start()
    step()
    first = meter.stop()
    assert not meter.running and meter.result == first
    meter.start()  # a meter can measure again (the peak meter makes a fresh tracker)
    step()
    assert meter.stop() == first
    with meter:  # and as a context manager
        step()
    assert meter.result == first
