"""The memory budget on a GPU (issue 36): the decision's measured peak fits its budget, and its
measured time is the fastest of the combinations its shortlist measured to fit."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from mmdropit.planner import StepProbe, plan_within_budget
from tests.helpers.split_target import SplitTarget

pytestmark = [pytest.mark.cuda,
              pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')]


def test_the_decision_fits_and_is_the_fastest_measured():
    """Exact techniques and a budget below the plain step's peak: nothing applied does not fit
    and no lossy preference applies, so the fastest measured fit is the choice (per-block
    checkpointing of the eight blocks among the candidates)."""
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Sequential(nn.Linear(512, 2048), nn.GELU(), nn.Linear(2048, 512))
                            for _ in range(8)]).cuda()
    x = torch.randn(4096, 512, device='cuda')

    def loss(size: int = 4096) -> torch.Tensor:
        return model(x[:size]).square().mean() * size / 4096

    probe = StepProbe(model, None, 4096, run_part=lambda size: loss(size).backward(),
                      forward_part=loss)
    decision = plan_within_budget(probe, 0.5, SplitTarget(model)).decision
    table = decision.table()
    assert decision.measured_bytes <= decision.budget_bytes, table
    assert len(decision.timed) >= 2, table  # one alone would not be timed
    assert all(decision.measured[name] <= decision.budget_bytes for name in decision.timed)
    assert decision.timed[decision.chosen.summary] == min(decision.timed.values()), table
