"""The comparison with compile's activation memory budget: each setting measured in its own
process, the profiler's meter checked against MemTracker on eager steps, and its report."""
from __future__ import annotations

import json

import torch
import torch.nn.functional as F
from torch import nn
from torch._functorch import config as functorch_config

from mmdropit.bench.compile_budget import (SETTINGS, Setting, measure_setting, run_comparison,
                                           write_comparison)
from mmdropit.bench.workload import Workload


def _mlp(name: str, batch_size: int, device: torch.device) -> Workload:
    blocks = [nn.Sequential(nn.LayerNorm(128), nn.Linear(128, 512), nn.GELU(),
                            nn.Linear(512, 128)) for _ in range(4)]
    model = nn.Sequential(*blocks, nn.Linear(128, 10)).to(device)
    inputs = torch.randn(batch_size, 128, device=device)
    labels = torch.randint(0, 10, (batch_size,), device=device)
    return Workload(name, model, lambda: F.cross_entropy(model(inputs), labels),
                    lambda enable: None, batch_size)


def test_settings_are_named_once_and_cover_both_sides():
    names = [setting.name for setting in SETTINGS]
    assert len(set(names)) == len(names) and names[0] == 'eager'
    assert {'compiled', 'compile-budget-0.0', 'plan-min', 'plan-min+compiled'} <= set(names)
    assert Setting(compiled=True, compile_budget=0.5, plan=0.5).name == \
        'plan-0.5+compile-budget-0.5'


def test_a_plan_lowers_the_metered_peak_and_a_compiled_setting_is_one_graph():
    eager, planned, compiled = (
        measure_setting('mlp', setting, batch_size=256, steps=1, build=_mlp)
        for setting in (Setting(), Setting(plan='min'), Setting(compiled=True,
                                                                compile_budget=0.0)))
    assert abs(eager.tracked_growth_bytes - eager.peak_growth_bytes) <= 1024
    assert planned.peak_growth_bytes < 0.8 * eager.peak_growth_bytes
    assert planned.plan_seconds > 0 and eager.plan_seconds is None
    assert (compiled.graphs, compiled.graph_breaks) == (1, 0)
    assert compiled.compile_seconds > 0 and compiled.tracked_growth_bytes is None
    assert eager.state_bytes == planned.state_bytes == compiled.state_bytes
    # the partitioner's global setting is put back (later compiled code in this process,
    # e.g. the next test, would otherwise recompute everything)
    assert functorch_config.activation_memory_budget == 1.0


def test_each_setting_runs_in_a_process_of_its_own_and_is_reported(tmp_path):
    settings = [Setting(), Setting(plan=0.5)]
    results = run_comparison(['deit_tiny'], batch_size=1, steps=1, settings=settings)
    assert [r.setting for r in results] == ['eager', 'plan-0.5']
    table = write_comparison(results, tmp_path, batch_size=1, steps=1)
    assert table.count('| deit_tiny |') == 2 and '| plan-0.5 |' in table
    saved = json.loads((tmp_path / 'compile_budget.json').read_text())
    assert [r['setting'] for r in saved['results']] == ['eager', 'plan-0.5']
    assert (tmp_path / 'compile_budget.png').stat().st_size > 0
