"""Measure, then choose: the search's choice is measured beside a shortlist (per-block
checkpointing, the fastest exact combination, ...), and the fastest measured to fit is taken,
whatever the predictions said. Step times here are made up on purpose (from which modules are
checkpointed), so that the predictions are wrong in a known way."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from torch import nn

from mmdropit.checkpoint import is_checkpointed
from mmdropit.dropit import is_dropit_layer
from mmdropit.planner import StepProbe, bf16_switch, plan_within_budget
from mmdropit.planner.estimate import Choice, Estimate
from mmdropit.planner.outcome import BudgetOutcome
from mmdropit.planner.search import EXACT_PREFERENCE
from mmdropit.planner.shortlist import (CLEAR_LEAD, NOTHING_PREFERENCE, _baselines,
                                       _median_seconds, _preferred)
from mmdropit.planner.switches import dropit_switch
from tests.helpers.split_target import SplitTarget

BLOCKS = 6
BATCH = 512


def _probe(per_block_factor: float, other_plan_factor: float) -> StepProbe:
    """Six repeated blocks; a pass takes ``0.3 + its share of the batch`` seconds, times
    ``per_block_factor`` while exactly the blocks are checkpointed, each whole and plainly, and
    ``other_plan_factor`` under any other checkpoints (the search may checkpoint the same
    blocks selectively, or a run of a block's children on the block)."""
    torch.manual_seed(0)
    blocks = nn.Sequential(*[nn.Sequential(nn.Linear(128, 128), nn.GELU(), nn.Linear(128, 128),
                                           nn.GELU()) for _ in range(BLOCKS)])
    net = nn.Sequential(nn.Linear(32, 128), blocks, nn.Linear(128, 10))
    x, y = torch.randn(BATCH, 32), torch.randint(0, 10, (BATCH,))

    def loss(size: int = BATCH) -> torch.Tensor:
        return nn.functional.cross_entropy(net(x[:size]), y[:size]) * size / BATCH

    per_block = {f'1.{index}' for index in range(BLOCKS)}

    def seconds(size: int, passes: int = 2) -> float:
        checkpointed = {name: getattr(module, '_mmdropit_selective', False)
                        or hasattr(module, '_mmdropit_runs')
                        for name, module in net.named_modules() if is_checkpointed(module)}
        exactly_per_block = set(checkpointed) == per_block and not any(checkpointed.values())
        factor = (1.0 if not checkpointed else
                  per_block_factor if exactly_per_block else other_plan_factor)
        return (0.3 + size / BATCH) * factor

    probe = StepProbe(net, None, BATCH, run_part=lambda size: loss(size).backward(),
                      forward_part=loss)
    probe.seconds = seconds
    return probe


def test_a_lossy_budget_measures_the_simple_recipe_in_bf16_beside_its_choice():
    """DropIT measures fast alone (0.5x) but slow in any combination (3x), so the DropIT
    combinations are predicted faster than bf16 + micro-batches and fill the predicted
    shortlist; bf16 (0.8x) measures as predicted. The fastest combination whose only lossy
    technique is bf16 is measured all the same, and taken."""
    probe = _probe(per_block_factor=1.5, other_plan_factor=2.0)
    target, precision = SplitTarget(probe.model), SimpleNamespace(switched_precision=None)
    loss, checkpoint_seconds = probe.forward_part, probe.seconds

    def autocast_loss(size: int = BATCH) -> torch.Tensor:
        with torch.autocast('cpu', torch.bfloat16,
                            enabled=precision.switched_precision is not None):
            return loss(size)

    def seconds(size: int, passes: int = 2) -> float:
        dropit = any(map(is_dropit_layer, probe.model.modules()))
        bf16 = precision.switched_precision is not None
        alone = target.micro_batches == 1 and not bf16
        factor = (0.5 if alone else 3.0) if dropit else 1.0
        return checkpoint_seconds(size, passes) * factor * (0.8 if bf16 else 1.0)

    probe.forward_part, probe.seconds = autocast_loss, seconds
    probe.run_part = lambda size: autocast_loss(size).backward()
    outcome = plan_within_budget(probe, 0.55, target,
                                 [dropit_switch(probe.model), bf16_switch(precision)])
    decision, timed = outcome.decision, _measured_fitting(outcome)
    assert decision.chosen.summary.startswith('bf16 autocast + 2 micro-batches'), \
        decision.table()
    assert timed[decision.chosen.summary] == min(timed.values()), decision.table()
    predicted = sorted(decision.considered, key=lambda e: e.time_ratio)
    assert predicted[0].setting('dropit') is not None  # the predictions preferred DropIT
    simple = [summary for summary in decision.timed if summary.startswith('bf16 autocast')]
    assert len(simple) == 2, decision.table()  # the recipe's two fastest (SIMPLE_BASELINES)


def _measured_fitting(outcome: BudgetOutcome) -> dict[str, float]:
    decision = outcome.decision
    return {summary: seconds for summary, seconds in decision.timed.items()
            if decision.measured[summary] <= decision.budget_bytes}


def test_a_model_whose_per_block_plan_is_fastest_gets_the_per_block_plan():
    """Per-block checkpointing measures faster than every other combination that fits: it is
    trained with, whatever the search predicted first."""
    probe = _probe(per_block_factor=1.1, other_plan_factor=2.0)
    outcome = plan_within_budget(probe, 0.75, SplitTarget(probe.model))
    decision = outcome.decision
    assert decision.chosen.summary.startswith('per-block checkpointing'), decision.table()
    assert {name for name, module in probe.model.named_modules() if is_checkpointed(module)} \
        == {f'1.{index}' for index in range(BLOCKS)}  # in effect
    timed = _measured_fitting(outcome)
    assert len(timed) >= 2 and timed[decision.chosen.summary] == min(timed.values())


def test_the_fastest_measured_combination_is_chosen_whatever_the_predictions_say():
    """The searched checkpoint plans measure faster than predicted (than micro-batches alone):
    one of them is taken because it measures fastest."""
    probe = _probe(per_block_factor=2.0, other_plan_factor=0.9)
    outcome = plan_within_budget(probe, 0.5, SplitTarget(probe.model))
    decision, timed = outcome.decision, _measured_fitting(outcome)
    assert len(timed) >= 2 and decision.chosen.summary in timed, decision.table()
    assert timed[decision.chosen.summary] == min(timed.values())
    assert 'checkpoint plan' in decision.chosen.summary, decision.table()
    predicted = next(e for e in decision.considered if e.summary == decision.chosen.summary)
    assert timed[decision.chosen.summary] < predicted.time_ratio
    assert decision.measured_bytes <= decision.budget_bytes


def test_measured_times_are_in_the_decision_table_and_its_json():
    probe = _probe(per_block_factor=1.1, other_plan_factor=2.0)
    outcome = plan_within_budget(probe, 0.75, SplitTarget(probe.model))
    chosen = outcome.decision.chosen.summary
    timed = outcome.decision.timed[chosen]
    row = next(line for line in outcome.to_json()['table'] if line.startswith(f'| {chosen} |'))
    assert f'| {timed:.2f}x | <- |' in row
    again = plan_within_budget(probe, 0.75, SplitTarget(probe.model), saved=outcome.to_json())
    assert again.reused and again.decision.chosen.summary == chosen


def _estimates(*summaries: str) -> list[Estimate]:
    start = Estimate(100, 900)
    return [start.choose(Choice('t', summary, summary), 400, 1.0) for summary in summaries]


def _level(estimate: Estimate) -> int:
    """How exact the made-up combinations are (:func:`~mmdropit.planner.shortlist.exactness`):
    ``'bf16...'`` lossy through the simple recipe only, ``'dropit...'`` otherwise lossy."""
    return 1 if estimate.summary.startswith('bf16') else \
        2 if estimate.summary.startswith('dropit') else 0


@pytest.mark.parametrize('lossy_time,taken', [(1.3, 'plan'), (1.0, 'plan'), (0.9, 'bf16')])
def test_a_lossy_combination_is_taken_only_when_it_measures_clearly_faster_than_the_exact_one(
        lossy_time, taken):
    """Measured slower, or within EXACT_PREFERENCE (5%) of the fastest exact combination that
    fits, the lossy one gives way (the exact one costs no accuracy); 10% faster, it is kept."""
    fitting = _estimates('bf16', 'plan')
    timed = {'bf16': lossy_time, 'plan': 1.04}
    assert 1.04 / 1.0 < EXACT_PREFERENCE < 1.04 / 0.9
    assert _preferred(fitting, timed, _level, None).summary == taken


def test_a_lossy_combination_is_taken_when_no_exact_one_measures_within_the_budget():
    fitting = _estimates('bf16')
    assert _preferred(fitting, {}, _level, None).summary == 'bf16'


@pytest.mark.parametrize('dropit_time,taken', [(0.97, 'bf16'), (0.9, 'dropit')])
def test_a_lossy_technique_beyond_bf16_is_taken_only_when_clearly_faster_than_bf16_alone(
        dropit_time, taken):
    """A combination that is lossy through DropIT or quantized activations must measure more
    than EXACT_PREFERENCE faster than the fastest whose only lossy technique is bf16 (which
    mixed precision takes anyway): Faster R-CNN's lossy budget at 0.5 took 8-bit activations +
    bf16 + 2 micro-batches at 0.52x over bf16 + 2 micro-batches + a plan at 0.54x."""
    fitting = _estimates('plan', 'bf16', 'dropit')
    timed = {'plan': 1.2, 'bf16': 1.0, 'dropit': dropit_time}
    assert _preferred(fitting, timed, _level, None).summary == taken


def test_one_slow_round_of_three_does_not_decide():
    """The median of the alternated rounds counts: a cold first round (2.6x, as the first step
    under bf16 after a metered one was seen to take) does not make a lossy choice give way."""
    fitting = _estimates('bf16', 'plan')
    times = {'bf16': [2.6, 0.5, 0.5], 'plan': [1.0, 1.0, 1.0]}
    timed, contenders = _median_seconds(fitting,
                                        lambda estimate: times[estimate.summary].pop(0))
    assert timed == {'bf16': 0.5, 'plan': 1.0}
    assert _preferred(contenders, timed, _level, None).summary == 'bf16'


def test_a_clear_leader_is_timed_for_two_rounds_and_a_close_race_for_three():
    """A combination fastest by more than 10% in both of two rounds ends the timing; one
    that leads by less, or only in one round, leaves a third round to decide."""
    fitting = _estimates('bf16', 'plan')
    clear = {'bf16': [0.5, 0.5, 0.5], 'plan': [1.0, 1.0, 1.0]}
    assert _median_seconds(fitting, lambda e: clear[e.summary].pop(0))[0] == {
        'bf16': 0.5, 'plan': 1.0}
    assert clear == {'bf16': [0.5], 'plan': [1.0]}
    close = {'bf16': [0.95, 0.95, 0.95], 'plan': [1.0, 1.0, 1.0]}
    _median_seconds(fitting, lambda e: close[e.summary].pop(0))
    assert close == {'bf16': [], 'plan': []}


def test_the_first_round_takes_its_times_from_first_seconds_and_later_rounds_time_again():
    fitting = _estimates('bf16', 'plan')
    first = {'bf16': [0.95], 'plan': [1.0]}  # no clear lead after two rounds: three
    later = {'bf16': [0.5, 0.5], 'plan': [1.0, 1.0]}
    timed, _ = _median_seconds(fitting, lambda e: later[e.summary].pop(0),
                               lambda e: first[e.summary].pop(0))
    assert timed == {'bf16': 0.5, 'plan': 1.0}
    assert first == {'bf16': [], 'plan': []} and later == {'bf16': [], 'plan': []}


def test_a_micro_batch_combination_s_first_round_is_the_pass_its_prediction_timed():
    """Micro-batches alone run the passes each size was timed with, nothing applied, when the
    sizes were predicted: the shortlist's first round takes those times and runs no pass for
    them; a combination with a checkpoint plan is timed in both. Here a plan measures clearly
    fastest, so two rounds are timed: one pass of each micro-batch size beyond its
    prediction's."""
    probe = _probe(per_block_factor=1.0, other_plan_factor=0.5)
    timed, made_up = [], probe.seconds

    def seconds(size: int, passes: int = 2) -> float:
        timed.append((size, any(map(is_checkpointed, probe.model.modules()))))
        return made_up(size, passes)

    probe.seconds = seconds
    decision = plan_within_budget(probe, 0.5, SplitTarget(probe.model)).decision
    micro = [e for e in decision.considered if e.summary in decision.timed
             and {c.technique for c in e.choices} == {'micro-batches'}]
    plans = [e for e in decision.considered if e.summary in decision.timed
             and e.setting('checkpoint-plan') is not None]
    assert micro and plans, decision.table()
    for estimate in micro:
        size = BATCH // estimate.setting('micro-batches')
        assert timed.count((size, False)) == 2, decision.table()
    assert sum(checkpointed for _, checkpointed in timed) == 2 * len(plans)


def test_a_combination_clearly_beaten_in_two_rounds_is_not_timed_a_third_time():
    """After two rounds, one that another beat by more than 10% in both drops out; the close
    race between the others gets its third round, and the dropped one keeps its two times'
    median. The margin covers the leads a less exact combination, or any against nothing
    applied, must show."""
    fitting = _estimates('bf16', 'plan', 'dropit')
    times = {'bf16': [0.50, 0.52, 0.51], 'plan': [0.53, 0.50, 0.52], 'dropit': [0.6, 0.7, 0.6]}
    timed, contenders = _median_seconds(fitting, lambda e: times[e.summary].pop(0))
    assert times == {'bf16': [], 'plan': [], 'dropit': [0.6]}
    assert timed == {'bf16': 0.51, 'plan': 0.52, 'dropit': pytest.approx(0.65)}
    assert [e.summary for e in contenders] == ['bf16', 'plan']
    assert CLEAR_LEAD >= max(EXACT_PREFERENCE, NOTHING_PREFERENCE)


def test_the_choice_is_made_among_the_combinations_still_timed():
    """An exact combination that a lossy one beat by more than 10% in both of two rounds drops
    out with the median of those two; the lossy one, timed a third time (a third combination
    keeps the race going) and slow in it, has a median over three rounds that reads less than
    5% faster. It is taken all the same: medians over other rounds are not compared (before
    stop 62 the exact one was taken here, on 0.9 * 1.05 >= 0.925)."""
    fitting = _estimates('exact', 'bf16 L', 'bf16 C')
    times = {'exact': [1.0, 0.85], 'bf16 L': [0.9, 0.77, 1.2], 'bf16 C': [0.95, 0.8, 1.0]}
    timed, contenders = _median_seconds(fitting, lambda e: times[e.summary].pop(0))
    assert times == {'exact': [], 'bf16 L': [], 'bf16 C': []}
    assert [e.summary for e in contenders] == ['bf16 L', 'bf16 C']
    assert timed == {'exact': pytest.approx(0.925), 'bf16 L': 0.9, 'bf16 C': 0.95}
    assert _preferred(fitting, timed, _level, None).summary == 'exact'  # all compared
    assert _preferred(contenders, timed, _level, None).summary == 'bf16 L'


def test_the_simple_recipe_s_baselines_are_bf16_combinations_where_exact_ones_are_faster():
    """Exact combinations predicted faster than the bf16 ones take the exact baseline's slot
    only: the simple recipe's two slots go to the two fastest lossy through bf16 alone (before
    stop 62 exact ones filled them too, and no bf16 combination was measured)."""
    considered = _estimates('exact a', 'exact b', 'bf16 a', 'bf16 b', 'dropit a')
    considered = [replace(e, time_ratio=ratio)
                  for e, ratio in zip(considered, (1.0, 1.1, 1.2, 1.3, 0.9))]
    trials = SimpleNamespace(plans=SimpleNamespace(per_block=None))
    found = _baselines(considered, 10**9, trials, Estimate(100, 900), False, _level)
    assert [e.summary for e in found] == ['exact a', 'bf16 a', 'bf16 b']


def test_where_nothing_applied_is_left_out_only_what_led_it_clearly_is_applied():
    """The step fits with nothing applied, and a lossy combination leads it by more than 10%
    in both rounds, so it is left out; an exact one 7% faster than it stays in the race (the
    lossy one leads it by less than 5%). Applied: the lossy one, which led nothing clearly,
    not the exact one, which nothing applied would have beaten on NOTHING_PREFERENCE (review
    of stop 62's first fix)."""
    fitting = _estimates('nothing', 'bf16 x', 'micro 4')
    nothing = fitting[0]
    times = {'nothing': [1.0, 1.0], 'bf16 x': [0.9, 0.9, 0.9], 'micro 4': [0.93, 0.93, 0.93]}
    timed, contenders = _median_seconds(fitting, lambda e: times[e.summary].pop(0),
                                        nothing=nothing)
    assert times == {'nothing': [], 'bf16 x': [], 'micro 4': []}
    assert [e.summary for e in contenders] == ['bf16 x']
    assert _preferred(contenders, timed, _level, None).summary == 'bf16 x'
    assert _preferred(contenders, timed, _level, nothing).summary == 'bf16 x'

