"""The memory budget on a GPU (issue 36): the decision's measured peak fits its budget, and its
measured time is the fastest of the combinations its shortlist measured to fit; a batch that
runs out of memory on the device is decided from its parts."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from mmdropit.memory import trial_peaks
from mmdropit.planner import StepProbe, plan_within_budget
from tests.helpers.split_target import SplitTarget

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')]


def _blocks_probe() -> StepProbe:
    """Eight MLP blocks on 4096 rows of 512 (about 0.6 GB of activations)."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512))
                            for _ in range(8)]).cuda()
    x = torch.randn(4096, 512, device='cuda')

    def loss(size: int = 4096) -> torch.Tensor:
        return model(x[:size]).square().mean() * size / 4096

    return StepProbe(model, None, 4096, run_part=lambda size: loss(size).backward(),
                     forward_part=loss)


def test_the_decision_fits_and_is_the_fastest_measured():
    """Exact techniques and a budget below the plain step's peak: nothing applied does not fit
    and no lossy preference applies, so the fastest measured fit is the choice (per-block
    checkpointing of the eight blocks among the candidates)."""
    probe = _blocks_probe()
    model = probe.model
    decision = plan_within_budget(probe, 0.5, SplitTarget(model)).decision
    table = decision.table()
    assert decision.measured_bytes <= decision.budget_bytes, table
    assert len(decision.timed) >= 2, table  # one alone would not be timed
    assert all(decision.measured[name] <= decision.budget_bytes for name in decision.timed)
    assert decision.timed[decision.chosen.summary] == min(decision.timed.values()), table


def test_a_batch_the_device_cannot_hold_is_decided_from_its_parts():
    """The process may hold 60% of the plain step's peak (``set_per_process_memory_fraction``,
    put back after): the whole batch runs out of memory, its peak is predicted from a part,
    and the decision's measured peak fits."""
    probe = _blocks_probe()
    plain = trial_peaks(lambda: probe.run_part(4096), probe.model).fresh
    torch.cuda.empty_cache()
    total = torch.cuda.get_device_properties(0).total_memory
    torch.cuda.set_per_process_memory_fraction(0.6 * plain / total)
    try:
        outcome = plan_within_budget(probe, 0.5, SplitTarget(probe.model))
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0)
    decision = outcome.decision
    assert outcome.unplanned_predicted_from, str(outcome)
    assert outcome.unplanned_peak == pytest.approx(plain, rel=0.1), str(outcome)
    assert decision.measured_bytes <= decision.budget_bytes, decision.table()


def test_per_block_checkpointing_with_its_inputs_on_the_host_frees_what_it_predicts():
    """The budget's candidates with checkpoint inputs allowed in host memory: per-block
    checkpointing with its inputs there is offered, and the planner's own measurements of it
    and of the same plan on the device differ by at least half the bytes their predictions
    differ by (the predictions come from a part of the batch and are not exact: a CPU run of
    this model at 32 samples measured the device plan 24% below its prediction)."""
    from mmdropit.planner.estimate import Estimate
    from mmdropit.planner.measurements import Measurements
    from mmdropit.planner.trials import Trials

    torch.manual_seed(0)
    model = nn.Sequential(nn.Sequential(*[
        nn.Sequential(nn.Linear(256, 1024), nn.GELU(), nn.Linear(1024, 256))
        for _ in range(8)]), nn.Linear(256, 8)).cuda()
    x = torch.randn(64, 256, 256, device='cuda')  # 64 sequences of 256 tokens

    def loss(size: int = 64) -> torch.Tensor:
        return model(x[:size]).square().mean() * size / 64

    probe = StepProbe(model, None, 64, run_part=lambda size: loss(size).backward(),
                      forward_part=loss)
    trials = Trials(Measurements(probe), [], SplitTarget(model), inputs_on_host=True)
    measurements = trials.measurements
    unplanned = measurements.unplanned_peak()
    start = Estimate(measurements.held(), measurements.whole - measurements.held())
    offered = {estimate.summary: estimate
               for estimate in trials.plans.candidates(start, unplanned // 4)}
    hosted, device = (next(estimate for name, estimate in offered.items()
                           if name.startswith('per-block') and (on_host == ('host' in name)))
                      for on_host in (True, False))
    peaks = [trials.peak(estimate) for estimate in (hosted, device)]
    trials.remove_all()
    predicted = device.peak_bytes - hosted.peak_bytes
    report = (peaks, hosted.peak_bytes, device.peak_bytes)
    assert predicted > 0, report
    assert peaks[1] - peaks[0] >= predicted / 2, report
