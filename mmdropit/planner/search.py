"""Combine techniques under one memory budget: predict every combination, take the fastest that
fits with a margin, measure it, and tighten when the measurement does not fit. A lossy
combination is also timed, beside the fastest exact one, and kept only if it is more than
:data:`EXACT_PREFERENCE` faster.

Example:
    >>> from .techniques import MicroBatches
    >>> micro = MicroBatches(16, seconds_of=lambda size: 0.1 + size)
    >>> decision = decide(Estimate(200, 1600), [micro], budget_bytes=700,
    ...                   measure=lambda estimate: estimate.peak_bytes + 20)
    >>> decision.chosen.summary, decision.measured_bytes
    ('4 micro-batches of at most 4', 620)
    >>> decision.table().splitlines()[0].split(' | ')[1:]
    ['predicted peak MiB', 'measured peak MiB', 'predicted time', 'measured time', 'chosen |']
"""
from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from ..errors import ConfigError
from .estimate import Estimate
from .techniques import Target, Technique

MARGIN = 0.05
"""A combination is chosen only if its predicted peak is at most ``1 - MARGIN`` of the budget,
unless none is: then one predicted within the budget itself is tried (its measurement decides)."""

ATTEMPTS = 3
"""Measured combinations that did not fit before the search gives up."""

EXACT_PREFERENCE = 1.05
"""A lossy combination is kept only if the fastest exact one that fits is predicted, or then
measured, at more than this many times its measured step time (the exact one costs no
accuracy)."""

LEAST_TOLERANCE = 0.01
"""For the least peak, measured peaks within this share of the lowest count as equal: the
fastest predicted of them is taken, an exact one before a lossy one (a lossy technique that
saves a few tenths of a percent more costs accuracy, and often time, for nothing)."""

NEAR_MEASUREMENTS = 4
"""Combinations predicted over the budget by no more than the bytes they may not hold (their
lossy settings' constant bytes under a checkpoint plan), measured at most for one decision (see
:func:`decide`)."""

MIB = 2**20

LOWER = 'sharding the model state with FSDP over several processes'
"""What goes lower than every technique here, for the error message of a budget none reaches."""


def combinations(start: Estimate, techniques: Sequence[Technique], budget_bytes: int,
                 fits: Callable[[Estimate], bool] | None = None) -> list[Estimate]:
    """Every combination of the techniques' candidates, each technique applied on top of the
    ones before it (in the order given).

    With ``fits`` (whether a combination fits the budget), a last technique that never makes a
    step faster (:attr:`~.techniques.Technique.slows_only`, as a checkpoint plan) is offered the
    combinations before it fastest first, and none slower than a fitting combination already
    found (those are listed as they are): nothing it would add could be chosen, and each of its
    candidates may cost a search.
    """
    frontier = [start]
    for index, technique in enumerate(techniques):
        if fits is not None and technique.slows_only and index == len(techniques) - 1:
            return _fastest_first(frontier, technique, budget_bytes, fits)
        frontier = [after for before in frontier
                    for after in technique.candidates(before, budget_bytes)]
    return frontier


def _fastest_first(frontier: Sequence[Estimate], technique: Technique, budget_bytes: int,
                   fits: Callable[[Estimate], bool]) -> list[Estimate]:
    """``technique``'s candidates on each of ``frontier``, fastest first; from the first
    combination slower than a fitting candidate on, the combinations as they are (so that the
    decision table still shows them)."""
    found: list[Estimate] = []
    fastest = math.inf
    for before in sorted(frontier, key=lambda e: (e.time_ratio, e.peak_bytes)):
        if before.time_ratio > fastest:
            found.append(before)
            continue
        for after in technique.candidates(before, budget_bytes):
            found.append(after)
            if fits(after):
                fastest = min(fastest, after.time_ratio)
    return found


@dataclass
class Decision:
    """The combination chosen for a budget, and every one considered.

    Attributes:
        budget_bytes: The budget.
        chosen: The combination trained with.
        measured_bytes: Its measured peak.
        considered: Every combination predicted, in the last search (and the exact ones a
            lossy choice was checked against).
        measured: Measured peaks by combination summary: every combination measured (the
            chosen one, those that did not fit, an exact one a lossy choice was checked
            against).
        timed: Measured step times (ratios to the step without techniques) by combination
            summary: a lossy choice and the exact combination it was checked against.
    """

    budget_bytes: int
    chosen: Estimate
    measured_bytes: int
    considered: list[Estimate] = field(default_factory=list)
    measured: dict[str, int] = field(default_factory=dict)
    timed: dict[str, float] = field(default_factory=dict)

    def table(self) -> str:
        """The decision table: every combination, its predicted and measured peak, its
        predicted and measured time, and which was chosen."""
        lines = ['| combination | predicted peak MiB | measured peak MiB | predicted time '
                 '| measured time | chosen |', '|---|---:|---:|---:|---:|---|']
        for estimate in sorted(self.considered, key=lambda e: (e.time_ratio, e.peak_bytes)):
            measured = self.measured.get(estimate.summary)
            timed = self.timed.get(estimate.summary)
            lines.append(
                f'| {estimate.summary} | {estimate.peak_bytes / MIB:.1f} | '
                f'{"" if measured is None else f"{measured / MIB:.1f}"} | '
                f'{estimate.time_ratio:.2f}x | {"" if timed is None else f"{timed:.2f}x"} | '
                f'{"<-" if estimate.summary == self.chosen.summary else ""} |')
        return '\n'.join(lines)


def remove_all(techniques: Sequence[Technique], target: Target) -> None:
    """Remove every technique from ``target``, the last applied first."""
    for technique in reversed(techniques):
        technique.remove(target)


def put_in_effect(estimate: Estimate, techniques: Sequence[Technique], target: Target) -> None:
    """Remove every technique from ``target``, then apply the settings ``estimate`` chose."""
    remove_all(techniques, target)
    by_name = {technique.name: technique for technique in techniques}
    for choice in estimate.choices:
        by_name[choice.technique].apply(choice.setting, target)


def fastest_fitting(considered: Sequence[Estimate],
                    fits: Callable[[Estimate], bool]) -> Estimate | None:
    """The fastest estimate that ``fits`` (the lower peak among equally fast ones); ``None``
    when none does."""
    return min((estimate for estimate in considered if fits(estimate)),
               key=lambda e: (e.time_ratio, e.peak_bytes), default=None)


def fits_within(estimate: Estimate, limit: int, correction: float = 1.0) -> bool:
    """Whether ``estimate``'s predicted peak, its activations multiplied by ``correction``, is
    at most ``limit``."""
    return estimate.fixed_bytes + estimate.activation_bytes * correction <= limit


@dataclass
class _Corrections:
    """How far measured activations were above their prediction, learnt from measured misses:
    a miss of an exact combination counts for every combination; one of a lossy combination
    only for combinations with the same lossy techniques (their effects were measured one at a
    time and multiplied, which can be far off for that one set and right for others).

    Attributes:
        limit: Predicted peaks must be at most this.
        lossy: Names of the lossy techniques.
        overall: The factor for every combination.
        by_lossy_choices: The factor per set of lossy techniques.
    """

    limit: int
    lossy: frozenset[str]
    overall: float = 1.0
    by_lossy_choices: dict[frozenset[str], float] = field(default_factory=dict)

    def lossy_choices(self, estimate: Estimate) -> frozenset[str]:
        """The lossy techniques ``estimate`` uses (empty when it is exact); their settings
        (DropIT's gammas, say) go wrong alike, so they are not told apart."""
        return frozenset(c.technique for c in estimate.choices if c.technique in self.lossy)

    def fits(self, estimate: Estimate) -> bool:
        """Whether ``estimate``'s corrected prediction is within the limit."""
        factor = max(self.overall, self.by_lossy_choices.get(self.lossy_choices(estimate), 1.0))
        return fits_within(estimate, self.limit, factor)

    def sized_for(self, start: Estimate) -> int:
        """The budget techniques size their settings for (a plan's share): the limit, the
        activations' part shrunk by the overall factor."""
        return start.fixed_bytes + int((self.limit - start.fixed_bytes) / self.overall)

    def learn(self, estimate: Estimate, peak: int) -> None:
        """Take ``estimate``'s measured ``peak`` into account: its activations measured some
        factor above their prediction (the state's bytes are known)."""
        short = (peak - estimate.fixed_bytes) / max(estimate.activation_bytes, 1)
        key = self.lossy_choices(estimate)
        if key:
            self.by_lossy_choices[key] = max(self.by_lossy_choices.get(key, 1.0), short)
        else:
            self.overall = max(self.overall, short)


def decide(start: Estimate, techniques: Sequence[Technique], budget_bytes: int,
           measure: Callable[[Estimate], int], lower: str = LOWER,
           seconds: Callable[[Estimate], float] | None = None,
           correction: float = 1.0) -> Decision:
    """The fastest combination whose predicted peak fits ``budget_bytes`` with
    :data:`MARGIN` (without it when none does) and whose measured peak fits it. When a
    measured peak does not fit, its activations measured some factor above their prediction
    (the state's bytes are known): the predicted activations are taken to be that short (all
    of them after an exact combination's
    miss, those with the same lossy techniques after a lossy one's), and the search runs again.

    Lossy techniques' effects are measured one at a time and multiplied, which can be far off
    for a combination of several (bf16 on micro-batches of one sample, say); so with
    ``seconds``, a lossy choice is timed, and the fastest exact combination predicted to fit is
    measured and timed too unless predicted clearly slower; the exact one is taken when it fits
    and is within :data:`EXACT_PREFERENCE` of the lossy one's time. When the lossy
    combinations measured over the budget and no corrected one is predicted to fit, the exact
    techniques are searched on their own.

    Lossy settings' constant bytes (bf16 autocast's cast copies of the weights) are counted
    whatever the other techniques, but under a checkpoint plan some may not be held (the copies
    DropIT's layers save, some of autocast's; how many, only a measurement tells:
    :attr:`~.estimate.Estimate.freeable_bytes`). So a combination faster than the choice whose
    predicted peak less those bytes fits is measured first, fastest first (at most
    :data:`NEAR_MEASUREMENTS` for a decision), and chosen if it fits.

    Args:
        start: The step without any technique, as measured.
        techniques: The techniques to combine, in the order they are applied.
        budget_bytes: The budget for the whole step's peak.
        measure: Applies a combination and returns its measured peak (it stays applied).
        lower: What would go lower than these techniques, for the error message.
        seconds: Applies a combination and returns its measured step time as a ratio to the
            step without techniques (it stays applied).
        correction: How many times their prediction activations measured already (every
            prediction's activations are multiplied by it).

    Returns:
        The decision; the chosen combination is applied.

    Raises:
        ConfigError: No combination is predicted to fit (the message gives the least predicted
            peak), or the measured ones did not fit and, corrected by their overshoot, no
            other is predicted to (at most :data:`ATTEMPTS` are measured).
    """
    corrections = _Corrections(int(budget_bytes * (1 - MARGIN)),
                               frozenset(t.name for t in techniques if t.lossy), correction)
    exact = [technique for technique in techniques if not technique.lossy]
    measured: dict[str, int] = {}
    timed: dict[str, float] = {}
    near_measured: dict[str, int] = {}  # combinations measured because they could fit

    def search(among: Sequence[Technique]) -> tuple[list[Estimate], Estimate | None]:
        """Every combination of ``among`` as corrected so far, and the fastest that fits."""
        considered = combinations(start, among, corrections.sized_for(start), corrections.fits)
        return considered, fastest_fitting(considered, corrections.fits)

    def near_fit(considered: Sequence[Estimate], chosen: Estimate | None) -> Estimate | None:
        """The fastest combination faster than ``chosen`` that is predicted over the budget by
        no more than the bytes it may not hold and measures within it, measuring them fastest
        first (each measured peak is kept)."""
        bound = math.inf if chosen is None else chosen.time_ratio
        for estimate in sorted(considered, key=lambda e: (e.time_ratio, e.peak_bytes)):
            if len(near_measured) >= NEAR_MEASUREMENTS or estimate.time_ratio >= bound:
                return None
            if (estimate.summary not in {**near_measured, **measured}
                    and estimate.freeable_bytes > 0
                    and estimate.peak_bytes - estimate.freeable_bytes <= budget_bytes):
                near_measured[estimate.summary] = measure(estimate)
                if near_measured[estimate.summary] <= budget_bytes:
                    return estimate
        return None

    def proven(estimate: Estimate, peak: int, considered: list[Estimate]) -> Decision:
        """The decision for ``estimate``, measured within the budget; a lossy one checked
        against the fastest exact combination (:func:`_check_against_exact`, whose measured
        peaks join ``measured``; the times of every check go to ``timed``)."""
        decision = Decision(budget_bytes, estimate, peak, considered, measured, timed)
        if seconds is not None and corrections.lossy_choices(estimate):
            _check_against_exact(decision, search(exact)[0], corrections.fits, measure,
                                 seconds)
        return decision

    for _ in range(ATTEMPTS):
        considered, chosen = search(techniques)
        if chosen is None and corrections.limit < budget_bytes:
            # none fits with the margin: those predicted within the budget itself are tried,
            # and their measurement decides
            corrections.limit = budget_bytes
            considered, chosen = search(techniques)
        predicted, near = chosen, near_fit(considered, chosen)
        if near is not None:
            chosen, peak = near, near_measured[near.summary]
        elif chosen is None and measured:
            break  # no corrected prediction fits
        elif chosen is None:
            least = min(considered, key=lambda e: e.peak_bytes)
            raise ConfigError(
                f'memory budget {budget_bytes / MIB:.1f} MiB is below what these techniques reach: '
                f'the least predicted step peak is {least.peak_bytes / MIB:.1f} MiB '
                f'({least.summary}; of it, parameters, gradients, optimizer state and what '
                f'every pass holds, which none of them lowers: {least.fixed_bytes / MIB:.1f} '
                f'MiB); raise the budget, or go lower with {lower}')
        else:
            peak = measure(chosen)
            measured[chosen.summary] = peak
        if peak <= budget_bytes:
            decision = proven(chosen, peak, considered)
            while near is not None and decision.chosen is not near:
                # the combination measured near timed slower than the exact one: the next
                near = near_fit(considered, predicted)
                if near is None:
                    measure(decision.chosen)  # puts the exact one back in effect
                else:
                    decision = proven(near, near_measured[near.summary], considered)
            decision.measured = {**near_measured, **measured}
            return decision
        corrections.learn(chosen, peak)
    if corrections.by_lossy_choices:
        # lossy predictions can be far off together; the exact ones are searched on their own,
        # with what exact misses taught
        with contextlib.suppress(ConfigError):
            decision = decide(start, exact, budget_bytes, measure, lower,
                              correction=corrections.overall)
            decision.measured = {**near_measured, **measured, **decision.measured}
            return decision
    raise ConfigError(
        f'memory budget {budget_bytes / MIB:.1f} MiB: the combinations predicted to fit measured '
        f'above it ({", ".join(f"{k}: {v / MIB:.1f} MiB" for k, v in measured.items())}) and no '
        f'other is predicted to fit after correcting for that; raise the budget, or go lower '
        f'with {lower}')


def decide_least(start: Estimate, techniques: Sequence[Technique],
                 measure: Callable[[Estimate], int]) -> Decision:
    """The combination with the least measured peak: the :data:`ATTEMPTS` combinations
    predicted lowest (each technique at its least-memory setting where it has one, e.g. the
    least-memory checkpoint plan) are measured, and the lowest measured is chosen; peaks within
    :data:`LEAST_TOLERANCE` of it count as equal: the fastest predicted of those, an exact one
    before a lossy one. Its measured peak becomes the decision's budget.

    Args:
        start: The step without any technique, as measured.
        techniques: The techniques to combine, in the order they are applied.
        measure: Applies a combination and returns its measured peak (it stays applied).

    Returns:
        The decision (the last combination measured is in effect, not necessarily the chosen
        one: put it in effect with :func:`put_in_effect`).

    Example:
        >>> from .techniques import MicroBatches
        >>> micro = MicroBatches(16, seconds_of=lambda size: 0.1 + size)
        >>> decision = decide_least(Estimate(200, 1600), [micro], lambda e: e.peak_bytes + 20)
        >>> decision.chosen.summary, decision.budget_bytes
        ('16 micro-batches of at most 1', 320)
    """
    considered = combinations(start, techniques, budget_bytes=0)
    lowest = sorted(considered, key=lambda e: (e.peak_bytes, e.time_ratio))[:ATTEMPTS]
    measured = {estimate.summary: measure(estimate) for estimate in lowest}
    floor = min(measured.values())
    lossy = {technique.name for technique in techniques if technique.lossy}
    chosen = min((e for e in lowest if measured[e.summary] <= floor * (1 + LEAST_TOLERANCE)),
                 key=lambda e: (any(c.technique in lossy for c in e.choices), e.time_ratio))
    return Decision(measured[chosen.summary], chosen, measured[chosen.summary], considered,
                    measured)


def _check_against_exact(decision: Decision, exact_combinations: list[Estimate],
                         fits: Callable[[Estimate], bool], measure: Callable[[Estimate], int],
                         seconds: Callable[[Estimate], float]) -> None:
    """Time ``decision``'s lossy choice, and take the fastest exact combination predicted to
    fit instead when it measures within the budget and within :data:`EXACT_PREFERENCE` of
    that time, the lossy one timed twice by then (a single timed pass can be slow: the first
    under bf16 after a metered pass took 2.6 times the next on ResNet-50). The decision's
    combination is in effect on return."""
    lossy = decision.chosen
    shown = {estimate.summary for estimate in decision.considered}
    decision.considered += [e for e in exact_combinations if e.summary not in shown]
    exact = fastest_fitting(exact_combinations, fits)
    decision.timed[lossy.summary] = lossy_time = seconds(lossy)
    if exact is None or exact.time_ratio > lossy_time * EXACT_PREFERENCE:
        return
    decision.measured[exact.summary] = peak = measure(exact)
    if peak <= decision.budget_bytes:
        decision.timed[exact.summary] = exact_time = seconds(exact)
        if exact_time <= lossy_time * EXACT_PREFERENCE:
            decision.timed[lossy.summary] = lossy_time = min(lossy_time, seconds(lossy))
            if exact_time > lossy_time * EXACT_PREFERENCE:
                return  # the lossy choice, timed again, is in effect
            # the exact one stays slower than the lossy one's fastest: put it back in effect
            decision.timed[exact.summary] = min(exact_time, seconds(exact))
            decision.chosen, decision.measured_bytes = exact, peak
            return
    # the lossy choice stays: put it back in effect, timing it once more
    decision.timed[lossy.summary] = min(lossy_time, seconds(lossy))
