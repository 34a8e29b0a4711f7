"""The memory-budget search: the fastest-first bound on slow techniques, lossy misses corrected
by technique, and lossy combinations that could fit without their constant bytes measured.
(Lossy choices against exact ones by measured time: tests/planner/test_shortlist.py.)"""
from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import replace

import pytest

from mmdropit.errors import ConfigError
from mmdropit.planner.combinations import combinations
from mmdropit.planner.corrections import fits_within
from mmdropit.planner.estimate import Choice, Effect, Estimate
from mmdropit.planner.least import LEAST_TOLERANCE, decide_least
from mmdropit.planner.search import ATTEMPTS, NEAR_MEASUREMENTS, decide
from mmdropit.planner.techniques import MeasuredSettings, MicroBatches, Technique


class Scaled(Technique):
    """A technique whose settings scale activations and time by fixed factors (and, as a
    checkpoint plan, may free the lossy settings' constant bytes); what is in effect is written
    to ``applied``."""

    def __init__(self, name: str, effects: dict[str, tuple[float, float]], applied: dict,
                 lossy: bool = False, slows_only: bool = False) -> None:
        self.name, self.effects, self.applied = name, effects, applied
        self.lossy, self.slows_only = lossy, slows_only
        self.offered: list[str] = []

    def candidates(self, estimate: Estimate, budget_bytes: int) -> Iterator[Estimate]:
        self.offered.append(estimate.summary)
        yield estimate
        for setting, (memory, time) in self.effects.items():
            chosen = estimate.choose(Choice(self.name, setting, setting),
                                     int(estimate.activation_bytes * memory),
                                     estimate.time_ratio * time)
            yield replace(chosen, freeable_bytes=estimate.lossy.constant_bytes
                          if self.slows_only else estimate.freeable_bytes)

    def apply(self, setting: object, target: object) -> None:
        self.applied[self.name] = setting

    def remove(self, target: object) -> None:
        self.applied.pop(self.name, None)


def _techniques(applied: dict, slows_only: bool = True) -> list[Scaled]:
    lossy = Scaled('lossy', {'half-precision': (0.6, 0.5)}, applied, lossy=True)
    split = Scaled('split', {'two parts': (0.5, 1.1), 'four parts': (0.25, 1.3)}, applied)
    plan = Scaled('plan', {'plan': (0.4, 1.3)}, applied, slows_only=slows_only)
    return [lossy, split, plan]


def _in_effect(estimate: Estimate, techniques: list[Scaled], applied: dict) -> None:
    applied.clear()
    for choice in estimate.choices:
        next(t for t in techniques if t.name == choice.technique).apply(choice.setting, None)


@pytest.mark.parametrize('budget', [900, 600, 350, 200])
def test_the_bound_skips_no_combination_that_could_be_chosen(budget):
    """The fastest-first expansion of the last, only-slower technique chooses what the
    exhaustive one chooses, and offers that technique fewer starting points."""
    start = Estimate(100, 1000)
    bounded, exhaustive = _techniques({}), _techniques({})
    fits = lambda e: fits_within(e, budget)  # noqa: E731
    fast = combinations(start, bounded, budget, fits)
    every = combinations(start, exhaustive, budget)
    assert len(every) == 2 * 3 * 2
    assert {e.summary for e in every if 'plan' not in e.summary} <= {e.summary for e in fast}
    best = min((e for e in every if fits(e)), key=lambda e: (e.time_ratio, e.peak_bytes))
    assert min((e for e in fast if fits(e)), key=lambda e: (e.time_ratio, e.peak_bytes)) == best
    assert len(bounded[-1].offered) < len(exhaustive[-1].offered) == 6


def _decide(budget: int, peak_over: dict[str, int]):
    applied: dict = {}
    techniques = _techniques(applied)

    def measure(estimate: Estimate) -> int:
        _in_effect(estimate, techniques, applied)
        return estimate.peak_bytes + peak_over.get(estimate.summary, 0)

    return decide(Estimate(100, 1000), techniques, budget, measure), applied


def test_lossy_combinations_measured_far_over_fall_back_to_the_exact_search():
    """Lossy effects multiplied can be far off together: when the lossy combinations measured
    over the budget and no corrected one is predicted to fit, the exact techniques are
    searched on their own and their choice is proved as usual."""
    over = {summary: 10_000 for summary in ('half-precision', 'half-precision + two parts',
                                            'half-precision + four parts')}
    decision, applied = _decide(350, over)
    assert 'half-precision' not in decision.chosen.summary
    assert decision.measured_bytes <= 350
    assert applied == {choice.technique: choice.setting for choice in decision.chosen.choices}
    assert any(summary.startswith('half-precision') for summary in decision.measured)


def test_a_lossy_miss_corrects_only_combinations_with_the_same_lossy_techniques():
    """Measured far over, combinations with the 'coarse' technique are corrected, whatever its
    setting; 'fine', measured on its own as well, keeps its prediction and is chosen (a global
    correction would have ruled out every lossy combination)."""
    applied: dict = {}
    coarse = Scaled('coarse', {'coarse 1': (0.3, 0.5), 'coarse 2': (0.32, 0.5)}, applied,
                    lossy=True)
    fine = Scaled('fine', {'fine': (0.5, 0.6)}, applied, lossy=True)
    techniques = [coarse, fine, *_techniques(applied)[1:]]

    def measure(estimate: Estimate) -> int:
        _in_effect(estimate, techniques, applied)
        return estimate.peak_bytes + (10_000 if 'coarse' in estimate.summary else 0)

    decision = decide(Estimate(100, 1000), techniques, 700, measure)
    assert decision.chosen.summary == 'fine'
    # 'coarse 2' is as wrong as 'coarse 1' and is not measured; 'coarse 1 + fine' is another set
    assert decision.measured == {'coarse 1': 10_400, 'coarse 1 + fine': 10_250, 'fine': 600}


def test_a_combination_predicted_within_the_budget_but_not_its_margin_is_tried():
    applied: dict = {}
    techniques = _techniques(applied)[1:]
    # the least predicted peak, four parts + plan, is 200: above 0.95 of 205, below 205
    decision = decide(Estimate(100, 1000), techniques, 205, lambda e: e.peak_bytes)
    assert decision.chosen.summary == 'four parts + plan' and decision.measured_bytes == 200


def test_the_least_peak_is_the_lowest_measured_of_the_lowest_predicted():
    """The combination predicted lowest measures above the next one: the next one is chosen,
    and its measured peak is the budget; only the lowest predicted few are measured."""
    applied: dict = {}
    techniques = _techniques(applied)[1:]

    def measure(estimate: Estimate) -> int:
        return estimate.peak_bytes + (500 if estimate.summary == 'four parts + plan' else 0)

    decision = decide_least(Estimate(100, 1000), techniques, measure)
    # predicted: four parts + plan 200, two parts + plan 300, four parts 350
    assert decision.chosen.summary == 'two parts + plan'
    assert decision.budget_bytes == decision.measured_bytes == 300
    assert len(decision.measured) == ATTEMPTS
    assert decision.measured['four parts + plan'] == 700


def test_the_least_peak_stays_within_the_slowdown_bound():
    """Micro-batches whose passes cost the same whatever their size (a host-bound step): the
    least peak within 2x the step's time is two micro-batches, not one per sample; without a
    bound, one per sample."""
    micro = MicroBatches(16, seconds_of=lambda size: 1.0)
    bounded = decide_least(Estimate(200, 1600), [micro], lambda e: e.peak_bytes)
    assert bounded.chosen.summary == '2 micro-batches of at most 8'
    assert all(estimate.time_ratio <= 2.0 for estimate in bounded.considered)
    unbounded = decide_least(Estimate(200, 1600), [micro], lambda e: e.peak_bytes,
                             max_slowdown=None)
    assert unbounded.chosen.summary == '16 micro-batches of at most 1'


def test_the_least_peak_stays_within_the_slowdown_bound_as_measured():
    """Each combination measures 1.5x its predicted time: 4 micro-batches, the lowest
    predicted within 2x (1.69x), measures 2.54x and gives way to 2 (1.85x measured); every
    measured time is in the decision."""
    micro = MicroBatches(16, seconds_of=lambda size: 0.3 + size / 16)

    def seconds(estimate: Estimate) -> float:
        return 1.5 * estimate.time_ratio if estimate.choices else 1.0

    predicted = decide_least(Estimate(200, 1600), [micro], lambda e: e.peak_bytes)
    assert predicted.chosen.summary == '4 micro-batches of at most 4'
    measured = decide_least(Estimate(200, 1600), [micro], lambda e: e.peak_bytes,
                            seconds=seconds)
    assert measured.chosen.summary == '2 micro-batches of at most 8'
    assert measured.timed[measured.chosen.summary] <= 2.0 < measured.timed[
        '4 micro-batches of at most 4']
    assert measured.budget_bytes == measured.measured_bytes


def test_when_every_lowest_measures_over_the_bound_the_predictions_are_scaled_and_more_tried():
    """Every combination measures 1.8x its prediction: 16, 8 and 4 micro-batches (predicted
    within 2x) all measure over it; scaled by 1.8, only 1 and 2 are left within it, and 2
    micro-batches are measured, within the bound, and chosen."""
    micro = MicroBatches(64, seconds_of=lambda size: 0.05 + size / 64)
    decision = decide_least(Estimate(200, 6400), [micro], lambda e: e.peak_bytes,
                            seconds=lambda e: 1.8 * e.time_ratio)
    assert decision.chosen.summary == '2 micro-batches of at most 32'
    assert len(decision.timed) == ATTEMPTS + 2  # the second round: 2 micro-batches and none
    assert all(decision.timed[summary] > 2.0 for summary in (
        '16 micro-batches of at most 4', '8 micro-batches of at most 8',
        '4 micro-batches of at most 16'))


def test_a_combination_measured_above_the_plain_peak_is_not_run_again_to_be_timed():
    """Out of memory measures twice the step's peak: such a combination is not timed (its
    pass would run out of memory again) and not chosen."""
    micro = MicroBatches(16, seconds_of=lambda size: 0.3 + size / 16)
    failing = '4 micro-batches of at most 4'

    def measure(estimate: Estimate) -> int:
        return 2 * 1800 if estimate.summary == failing else estimate.peak_bytes

    def seconds(estimate: Estimate) -> float:
        assert estimate.summary != failing
        return estimate.time_ratio

    decision = decide_least(Estimate(200, 1600), [micro], measure, seconds=seconds)
    assert failing in decision.measured and failing not in decision.timed
    assert decision.chosen.summary == '2 micro-batches of at most 8'


def test_where_nothing_measures_within_the_bound_the_fastest_measured_is_taken():
    micro = MicroBatches(16, seconds_of=lambda size: 0.3 + size / 16)
    decision = decide_least(Estimate(200, 1600), [micro], lambda e: e.peak_bytes,
                            seconds=lambda e: 5.0 * e.time_ratio)
    assert decision.chosen.summary == min(decision.timed, key=decision.timed.get)


def test_the_least_peak_takes_the_exact_combination_when_a_lossy_one_saves_next_to_nothing():
    """A lossy combination measured a few tenths of a percent lower than an exact one: the
    exact one is chosen (and its peak is the budget); a lossy one lower by more is chosen."""
    applied: dict = {}
    lossy = Scaled('lossy', {'half-precision': (0.995, 1.2)}, applied, lossy=True)
    split = Scaled('split', {'four parts': (0.25, 1.3)}, applied)
    techniques = [lossy, split]
    decision = decide_least(Estimate(100, 1000), techniques, lambda e: e.peak_bytes)
    # predicted and measured: half-precision + four parts 348, four parts 350 (0.6% above)
    assert 350 <= 348 * (1 + LEAST_TOLERANCE)
    assert decision.chosen.summary == 'four parts'
    assert decision.budget_bytes == 350

    lossy.effects = {'half-precision': (0.9, 1.2)}
    decision = decide_least(Estimate(100, 1000), techniques, lambda e: e.peak_bytes)
    assert decision.chosen.summary == 'half-precision + four parts'



def _cast_weights(applied: dict) -> list[Technique]:
    """bf16 with 60 bytes of cast weights, an exact split into 2, 4 or 8 parts and a plan."""
    bf16 = MeasuredSettings('bf16', ['bf16'], lambda setting: Effect(0.5, 0.5, 60), str,
                            lambda setting: applied.__setitem__('bf16', setting),
                            lambda: applied.pop('bf16', None))
    split = Scaled('split', {'two parts': (0.5, 1.1), 'four parts': (0.25, 1.3),
                             'eight parts': (0.125, 1.5)}, applied)
    plan = Scaled('plan', {'plan': (0.4, 1.3)}, applied, slows_only=True)
    return [bf16, split, plan]


@pytest.mark.parametrize('freed_by_plan', [True, False])
def test_a_planned_combination_over_the_budget_by_its_lossy_constant_bytes_is_measured(
        freed_by_plan):
    """Predicted, bf16 + eight parts + plan fits the budget of 200 (184, 0.98x); bf16 + two
    parts + plan (260, 0.72x) and bf16 + four parts + plan (210, 0.85x) are faster and over it
    by no more than bf16's 60 constant bytes, which the plan may free: they are measured,
    fastest first, and the first that fits is chosen (when the plan frees them)."""
    applied: dict = {}
    techniques = _cast_weights(applied)

    def measure(estimate: Estimate) -> int:
        _in_effect(estimate, techniques, applied)
        freed = freed_by_plan and 'bf16' in applied and 'plan' in applied
        return estimate.peak_bytes - (60 if freed else 0)

    decision = decide(Estimate(100, 1000), techniques, 200, measure)
    if freed_by_plan:
        assert decision.chosen.summary == 'bf16 + two parts + plan'
        assert decision.measured == {'bf16 + two parts + plan': 200}
        assert applied == {'bf16': 'bf16', 'split': 'two parts', 'plan': 'plan'}
    else:
        assert decision.chosen.summary == 'bf16 + eight parts + plan'
        assert decision.measured == {'bf16 + two parts + plan': 260,
                                     'bf16 + four parts + plan': 210,
                                     'bf16 + eight parts + plan': 184}
        assert applied == {'bf16': 'bf16', 'split': 'eight parts', 'plan': 'plan'}
    # bf16 + eight parts (222, 0.75x) has no plan to free bf16's bytes: it is not measured
    assert 'bf16 + eight parts' not in decision.measured


def test_combinations_over_the_budget_by_their_constant_bytes_are_measured_a_few_times_at_most():
    """Six lossy settings, each with constant bytes that the plan does not free after all: at
    most NEAR_MEASUREMENTS of their combinations are measured before the exact choice is
    proved."""
    applied: dict = {}
    settings = [f'setting {k}' for k in range(6)]

    def effect_of(setting: str) -> Effect:
        return Effect(0.5, 0.5 + 0.01 * settings.index(setting), 60)

    lossy = MeasuredSettings('lossy', settings, effect_of, str,
                             lambda setting: applied.__setitem__('lossy', setting),
                             lambda: applied.pop('lossy', None))
    techniques = [lossy, *_techniques(applied)[1:]]
    decision = decide(Estimate(100, 1000), techniques, 200, lambda e: e.peak_bytes)
    near = [summary for summary in decision.measured if summary.startswith('setting')]
    assert len(near) == NEAR_MEASUREMENTS < len(settings)
    assert decision.chosen.summary == 'four parts + plan'


def test_an_unreachable_budget_names_the_least_peak_and_the_state_within_it():
    """The state the message names is that of the least combination: the undivided batch does
    not hold its gradients at its peak, so the start's state (gradients held) can exceed it."""
    mib = 2**20
    micro = MicroBatches(8, seconds_of=lambda size: 0.1 + size, undivided_saving=150 * mib)
    with pytest.raises(ConfigError) as error:
        decide(Estimate(300 * mib, 80 * mib), [micro], budget_bytes=100 * mib,
               measure=lambda e: e.peak_bytes)
    numbers = [float(n) for n in re.findall(r'(\d+\.\d+) MiB', str(error.value))]
    assert numbers == [100, 230, 150]  # budget; the undivided batch, 150 + 80; its state
