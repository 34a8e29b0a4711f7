"""plan_within_budget on a bare model: for the least peak, each lossy technique is measured at
its leanest setting only (a setting the same technique beats in memory cannot give it)."""
from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from torch import nn

from mmdropit import ConfigError
from mmdropit.checkpoint import is_checkpointed
from mmdropit.dropit import DropITConfig
from mmdropit.planner import StepProbe, plan_within_budget
from mmdropit.planner.measurements import Measurements
from mmdropit.planner.switches import dropit_switch, quantize_switch, quantize_unavailable
from tests.helpers.split_target import SplitTarget


def _probe() -> StepProbe:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 128), *[nn.Sequential(nn.Linear(128, 128), nn.GELU())
                                              for _ in range(4)], nn.Linear(128, 10))
    x, y = torch.randn(512, 32), torch.randint(0, 10, (512,))

    def loss(size: int = 512) -> torch.Tensor:
        return nn.functional.cross_entropy(net(x[:size]), y[:size]) * size / 512

    return StepProbe(net, None, 512, run_part=lambda size: loss(size).backward(),
                     forward_part=loss)


def _recording_switch(probe: StepProbe, applied: list) -> object:
    switch = dropit_switch(probe.model)

    def apply(config: DropITConfig) -> None:
        applied.append(config.gamma)
        switch.apply(config)

    return replace(switch, apply=apply)


def test_the_least_peak_measures_each_lossy_technique_at_its_leanest_setting_only():
    probe, applied = _probe(), []
    outcome = plan_within_budget(probe, None, SplitTarget(probe.model),
                                 [_recording_switch(probe, applied)])
    assert applied and set(applied) == {0.9}
    assert outcome.least and outcome.decision.measured_bytes == outcome.decision.budget_bytes


def test_the_least_peak_times_micro_batches_alone_by_the_passes_their_prediction_timed():
    """A combination of micro-batches alone, measured for the least peak, gets the time of the
    passes its sizes were timed with (nothing applied) when they were predicted: no pass of
    its size runs again to time it."""
    probe = _probe()
    sizes, seconds = [], probe.seconds  # the sizes timed with nothing applied

    def recorded_seconds(size: int, passes: int = 2) -> float:
        if not any(map(is_checkpointed, probe.model.modules())):
            sizes.append(size)
        return seconds(size, passes)

    probe.seconds = recorded_seconds
    decision = plan_within_budget(probe, None, SplitTarget(probe.model),
                                  max_slowdown=100.0).decision
    alone = [e for e in decision.considered if e.summary in decision.timed
             and {choice.technique for choice in e.choices} == {'micro-batches'}]
    assert alone, decision.table()
    for estimate in alone:
        assert sizes.count(512 // estimate.setting('micro-batches')) == 1, decision.table()


def test_a_budget_measures_every_setting():
    probe, applied = _probe(), []
    plan_within_budget(probe, 0.9, SplitTarget(probe.model), [_recording_switch(probe, applied)])
    assert {0.5, 0.7, 0.9} <= set(applied)


@pytest.mark.parametrize('cold_passes', [True, False])
def test_on_a_gpu_every_time_is_the_faster_of_two_passes(cold_passes):
    """On a GPU any pass may be cold (cuDNN / cuBLAS pick kernels per shape, and the step-peak
    meter empties the allocator's cache before each measured pass): every time, the plain
    step's that the table's ratios are to and a lossy setting's included, is the faster of two
    passes (an H200 run timed DeiT-S's plain step 1.3x too slow from one). On CPU a size
    smaller than one before is timed once, even the first time it runs."""
    probe = replace(_probe(), cold_passes=cold_passes)
    ran: set[int] = set()
    single, cold_single = [], []
    peak, peaks, seconds = probe.peak, probe.peaks, probe.seconds

    def recorded_peak(size: int, gradients_held: bool = True):
        ran.add(size)
        return peak(size, gradients_held)

    def recorded_peaks(size: int):
        ran.add(size)
        return peaks(size)

    def recorded_seconds(size: int, passes: int = 2) -> float:
        if passes == 1:
            single.append(size)
            if size not in ran:
                cold_single.append(size)
        ran.add(size)
        return seconds(size, passes)

    probe.peak, probe.peaks, probe.seconds = recorded_peak, recorded_peaks, recorded_seconds
    plan_within_budget(probe, 0.3, SplitTarget(probe.model), [dropit_switch(probe.model)])
    assert bool(single) != cold_passes, single
    assert bool(cold_single) != cold_passes, cold_single


def _one_sample_probe() -> StepProbe:
    """The step a decision in ``data/`` was made for: one sample, so no micro-batches."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 64), *[nn.Sequential(
        nn.Linear(64, 64), nn.GELU(), nn.LayerNorm(64)) for _ in range(6)], nn.Linear(64, 10))
    x, y = torch.randn(1, 32), torch.randint(0, 10, (1,))

    def loss(size: int = 1) -> torch.Tensor:
        return nn.functional.cross_entropy(net(x[:size]), y[:size]) * size

    return StepProbe(net, None, 1, run_part=lambda size: loss(size).backward(),
                     forward_part=loss)


def test_a_decision_saved_before_settings_were_configurations_is_put_in_effect_again():
    """``decision_with_setting_positions.json`` was written by the planner of 2026-11-26
    (commit 577415d), which saved each measured setting as its position among the settings;
    today's planner saves the setting's configuration, and reads both."""
    saved = json.loads((Path(__file__).parent / 'data' /
                        'decision_with_setting_positions.json').read_text())
    assert [row['setting'] for row in saved['choices'][:2]] == [0, 0]
    probe = _one_sample_probe()
    switches = [dropit_switch(probe.model), quantize_switch(probe.model)]
    outcome = plan_within_budget(probe, None, SplitTarget(probe.model), switches, saved=saved)
    assert outcome.reused and outcome.decision.chosen.summary == saved['chosen']
    assert [type(m).__name__ for m in probe.model[1]] == ['DropITLinear', 'CompressedGELU',
                                                          'CompressedLayerNorm']
    written = outcome.to_json()
    assert written['choices'][0]['setting']['gamma'] == 0.9
    assert written['choices'][1]['setting']['bits'] == 4
    for switch in switches:
        switch.remove()
    again = plan_within_budget(probe, None, SplitTarget(probe.model), switches, saved=written)
    assert again.reused and again.decision.chosen.summary == saved['chosen']


@pytest.mark.parametrize('split_speed,applied', [(0.95, False), (0.7, True)])
def test_where_nothing_is_needed_a_combination_must_measure_clearly_faster(split_speed, applied):
    """The budget is the plain step's own peak: a combination is applied only if it measures
    more than 10% faster than the plain step (here split passes take ``split_speed`` of their
    samples' share: 5% faster is noise, 30% is not)."""
    probe = _probe()
    probe.seconds = lambda size, passes=2: size * (split_speed if size < 512 else 1.0)
    outcome = plan_within_budget(probe, 1.0, SplitTarget(probe.model))
    chosen = outcome.decision.chosen
    assert bool(chosen.choices) is applied, outcome.decision.table()
    assert outcome.decision.timed['nothing'] == pytest.approx(1.0)
    assert outcome.decision.measured_bytes <= outcome.decision.budget_bytes


def test_quantized_activations_are_offered_on_a_cpu():
    """(On a GPU only when their codecs' Triton kernels can run: tests/cuda/test_cuda_paths.py.)"""
    assert quantize_unavailable(nn.Linear(2, 2)) is None


def _probe_on_a_device_for(samples: int, attempted: list[int]) -> StepProbe:
    """:func:`_probe`, whose forward passes of more than ``samples`` samples run out of memory
    once they have run, as on a device too small for the batch; every trial pass's size is
    appended to ``attempted``."""
    probe = _probe()
    loss = probe.forward_part

    def forward_part(size: int) -> torch.Tensor:
        value = loss(size)
        if size > samples:
            raise torch.OutOfMemoryError(f'{size} samples do not fit')
        return value

    def run_part(size: int) -> None:
        attempted.append(size)
        forward_part(size).backward()

    return replace(probe, run_part=run_part, forward_part=forward_part)


def test_a_batch_that_runs_out_of_memory_is_planned_from_a_part():
    """The whole batch runs out of memory with nothing applied: its peak and time are
    predicted from a part, and the decision splits it into parts that fit, measured."""
    measured = plan_within_budget(_probe(), 0.5, SplitTarget(_probe().model))
    attempted: list[int] = []
    probe = _probe_on_a_device_for(200, attempted)
    outcome = plan_within_budget(probe, 0.5, SplitTarget(probe.model))
    decision = outcome.decision
    assert outcome.unplanned_predicted_from == 8
    assert outcome.unplanned_peak == pytest.approx(measured.unplanned_peak, rel=0.02)
    assert decision.chosen.setting('micro-batches', 1) >= 2, decision.table()
    assert decision.measured_bytes <= decision.budget_bytes
    assert attempted.count(512) == 1  # the failed pass only: neither timed nor run again
    assert 'the whole batch ran out of memory' in str(outcome)
    assert outcome.to_json()['unplanned_predicted_from'] == 8


def test_a_size_that_runs_out_of_memory_is_timed_once_as_its_half_scaled():
    """Two micro-batches of 256 run out of memory: their time is that of 128 samples, scaled,
    and no pass of 256 is timed again for another combination."""
    timed: list[int] = []
    probe = _probe_on_a_device_for(200, [])
    seconds = probe.seconds

    def recorded_seconds(size: int, passes: int = 2) -> float:
        timed.append(size)
        return seconds(size, passes)

    probe.seconds = recorded_seconds
    outcome = plan_within_budget(probe, 0.5, SplitTarget(probe.model))
    halves = next(e for e in outcome.decision.considered if e.summary.startswith('2 micro'))
    quarters = next(e for e in outcome.decision.considered if e.summary.startswith('4 micro'))
    assert halves.time_ratio == pytest.approx(quarters.time_ratio)
    assert timed.count(256) == 1, timed


def test_a_size_whose_pass_fails_is_tried_once():
    """BatchNorm1d cannot train on one sample: that size is tried once, and its error raised
    again for every later combination micro-batches are offered with."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(32, 64), nn.BatchNorm1d(64), nn.GELU(), nn.Linear(64, 10))
    x = torch.randn(16, 32)
    tried: list[int] = []

    def run_part(size: int) -> None:
        tried.append(size)
        net(x[:size]).sum().backward()

    measurements = Measurements(StepProbe(net, None, 16, run_part=run_part,
                                          forward_part=lambda size: net(x[:size]).sum()))
    for _ in range(3):
        with pytest.raises(ValueError, match='more than 1 value per channel'):
            measurements.seconds_of(1)
    assert tried == [1]


@pytest.mark.parametrize('budget', [0.5, None])
def test_a_part_that_runs_out_of_memory_is_halved_until_one_runs(budget):
    probe = _probe_on_a_device_for(4, [])
    outcome = plan_within_budget(probe, budget, SplitTarget(probe.model))
    decision = outcome.decision
    assert outcome.unplanned_predicted_from == 4
    assert decision.chosen.setting('micro-batches', 1) >= 128, decision.table()
    assert decision.measured_bytes <= decision.budget_bytes


def test_a_pass_out_of_memory_in_any_process_is_out_of_memory_in_all():
    """``agree_seconds`` gives the longest time of the processes: infinite where one ran out
    of memory, and each raises it, so that all take the same path."""
    probe = replace(_probe(), agree_seconds=lambda seconds: math.inf)
    with pytest.raises(torch.OutOfMemoryError, match='a pass of 8 samples'):
        probe.seconds(8)
    agreed: list[float] = []
    probe = replace(_probe_on_a_device_for(4, []), agree_seconds=lambda s: agreed.append(s) or s)
    with pytest.raises(torch.OutOfMemoryError):
        probe.seconds(8)
    assert agreed == [math.inf]


def test_a_saved_least_peak_decision_that_runs_out_of_memory_now_is_not_kept():
    """A least-peak decision is kept as it measures when a run resumes, but not when its pass
    runs out of memory (a smaller device): the step is measured anew (here nothing fits, so
    that ends in the one-line error)."""
    probe = _probe()
    saved = plan_within_budget(probe, None, SplitTarget(probe.model)).to_json()
    probe = _probe_on_a_device_for(0, [])
    with pytest.raises(ConfigError, match='one sample ran out of memory'):
        plan_within_budget(probe, None, SplitTarget(probe.model), saved=saved)


@pytest.mark.parametrize('key', ['unplanned_peak_bytes', 'budget_bytes', 'choices'])
def test_a_saved_decision_missing_a_field_is_searched_again(key):
    """An edited or older ``memory_plan.json`` entry without a field the reuse reads is
    searched anew (and says why), with nothing left applied from it."""
    probe = _probe()
    saved = plan_within_budget(probe, 0.5, SplitTarget(probe.model)).to_json()
    del saved[key]
    probe = _probe()
    outcome = plan_within_budget(probe, 0.5, SplitTarget(probe.model), saved=saved)
    assert not outcome.reused and key in outcome.unused_saved
    assert outcome.decision.measured_bytes <= outcome.decision.budget_bytes


def test_a_budget_above_a_batch_that_ran_out_of_memory_still_splits_it():
    probe = _probe_on_a_device_for(300, [])
    outcome = plan_within_budget(probe, 2**40, SplitTarget(probe.model))
    decision = outcome.decision
    assert decision.budget_bytes < outcome.unplanned_peak
    assert decision.chosen.setting('micro-batches', 1) >= 2, decision.table()
    assert decision.measured_bytes <= decision.budget_bytes
    # a plan on the whole batch was measured, and ran out of memory: the table says so
    assert '| out of memory |' in decision.table(), decision.table()


def test_a_sample_that_runs_out_of_memory_is_a_one_line_error():
    probe = _probe_on_a_device_for(0, [])
    with pytest.raises(ConfigError, match='one sample ran out of memory') as error:
        plan_within_budget(probe, 0.5, SplitTarget(probe.model))
    assert '\n' not in str(error.value)
