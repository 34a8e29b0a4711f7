"""Measure, then choose: the combinations predicted to fit a budget make a shortlist, each is put
in effect and measured (its peak, and its step time over alternated rounds), and the fastest
one measured to fit is trained with (:func:`choose_measured`).

Predicted times come from passes measured one technique at a time; they miss what a combination
costs as a whole on the training device (a checkpoint's own host time, a selective region's
dispatch on every operator, nested recomputation, lossy techniques together). So the search's
choice is measured beside the fastest exact combination predicted to fit, per-block
checkpointing of the model's repeated blocks (the simple baseline: timm's
``set_grad_checkpointing()``), the step with nothing applied where it fits, the two fastest
whose lossy techniques the simple recipe uses (bf16 autocast with micro-batches or per-block
checkpointing, where lossy techniques are allowed), and the next fastest predicted ones:
:data:`SHORTLIST` in all.

Example:
    >>> from .estimate import Choice, Estimate
    >>> start = Estimate(100, 900)
    >>> a = start.choose(Choice('micro-batches', 2, '2 micro-batches'), 450, 1.0)
    >>> b = start.choose(Choice('micro-batches', 4, '4 micro-batches'), 225, 1.1)
    >>> c = start.choose(Choice('micro-batches', 8, '8 micro-batches'), 112, 1.2)
    >>> [e.summary for e in shortlist([start, a, b, c], a, budget_bytes=600, count=2)]
    ['2 micro-batches', '4 micro-batches']
"""
from __future__ import annotations

import statistics
from collections.abc import Callable, Sequence
from dataclasses import replace

from .combinations import put_in_effect
from .decision import Decision
from .estimate import Estimate
from .search import EXACT_PREFERENCE
from .techniques import Technique
from .trials import Trials

SHORTLIST = 5
"""Combinations measured for one decision, the search's choice and the baselines included (where
those are six, nothing, the fastest exact one, per-block checkpointing and two of the simple
recipe all predicted to fit and distinct, the second of the simple recipe is left out)."""
ROUNDS = 3
"""Timed steps of each shortlisted combination at most, alternated between them (the median
counts; fewer where :data:`CLEAR_LEAD` leaves one out)."""
CLEAR_LEAD = 1.10
"""After two rounds a combination that another was faster than by more than this factor in
both is not timed again, and the timing stops where one is left: a third round could not change
which is the faster by more than the noise (10-30% between runs on this CPU; steps of one process
alternated agree far closer), and a decision on the CPU is mostly these timed steps. At
least :data:`~.search.EXACT_PREFERENCE` and :data:`NOTHING_PREFERENCE`, so that a combination
left out could not have been preferred for those (where the step with nothing applied is left
out, what is applied instead led it by as much: :func:`_median_seconds`)."""
SIMPLE_BASELINES = 2
"""Combinations of the simple recipe (lossy techniques all simple: bf16 autocast) measured for
a decision, the fastest predicted first: neighbours such as bf16 + 4 and bf16 + 8
micro-batches are predicted a few percent apart and measured further apart (DeiT-S at batch 64
on the CPU: 0.56x and 0.54x predicted, 0.51x and 0.55x measured)."""
NOTHING_PREFERENCE = 1.10
"""Where the step fits the budget with nothing applied, a combination is applied only if its
measured step time is below the plain step's by more than this factor (this CPU's timing noise
is 10-30% between runs; a combination chosen on noise made three fresh runs of one config apply
4, 4 and 2 micro-batches where nothing was needed)."""


def shortlist(considered: Sequence[Estimate], chosen: Estimate, budget_bytes: int,
              first: Sequence[Estimate] = (), count: int = SHORTLIST) -> list[Estimate]:
    """``chosen``, then ``first`` (the baselines), then the fastest other combinations of
    ``considered`` predicted to fit ``budget_bytes``: ``count`` distinct ones at most."""
    fitting = _predicted_to_fit(considered, budget_bytes)
    listed: dict[str, Estimate] = {}
    for estimate in (chosen, *first, *fitting):
        if len(listed) < count:
            listed.setdefault(estimate.summary, estimate)
    return list(listed.values())


def _predicted_to_fit(considered: Sequence[Estimate], budget_bytes: int) -> list[Estimate]:
    """The combinations of ``considered`` predicted within ``budget_bytes``, fastest first."""
    return sorted((e for e in considered if e.peak_bytes <= budget_bytes),
                  key=lambda e: (e.time_ratio, e.peak_bytes))


def choose_measured(decision: Decision, trials: Trials, start: Estimate,
                    unplanned: int) -> Decision:
    """``decision`` with the fastest shortlisted combination measured to fit its budget (see
    the module), every measured peak and median time in its table; that combination is in
    effect on return.

    The most exact combination that fits is taken unless a less exact one measures more than
    :data:`~.search.EXACT_PREFERENCE` faster (:func:`exactness`: exact, then lossy through the
    simple recipe's techniques only, bf16 autocast, then any other lossy one); where the step
    fits with nothing applied (``unplanned`` within the budget), a combination only if it
    measures more than :data:`NOTHING_PREFERENCE` faster than nothing.
    """
    budget = decision.budget_bytes
    level = exactness(trials.techniques)
    nothing_fits = unplanned <= budget
    if nothing_fits:
        decision.measured[start.summary] = unplanned
    listed = shortlist(decision.considered, decision.chosen, budget,
                       _baselines(decision.considered, budget, trials, start, nothing_fits,
                                  level))
    for estimate in listed:
        if estimate.summary not in decision.measured:
            decision.measured[estimate.summary] = trials.peak(estimate)
    fitting = [e for e in listed if decision.measured[e.summary] <= budget]
    nothing = start if nothing_fits else None
    timed, contenders = _median_seconds(fitting, trials.seconds, trials.first_seconds, nothing)
    decision.timed.update(timed)
    shown = {estimate.summary for estimate in decision.considered}
    decision.considered += [e for e in listed if e.summary not in shown]
    best = _preferred(contenders, timed, level, nothing)
    put_in_effect(best, trials.techniques, trials.target)
    return replace(decision, chosen=best, measured_bytes=decision.measured[best.summary])


def exactness(techniques: Sequence[Technique]) -> Callable[[Estimate], int]:
    """How exact a combination of ``techniques`` is: 0 exact, 1 lossy through
    :attr:`~.techniques.Technique.simple` techniques only (bf16 autocast, which mixed-precision
    training takes anyway), 2 through any other lossy one (DropIT, quantized activations).

    Example:
        >>> from .estimate import Choice
        >>> from .techniques import MeasuredSettings, MicroBatches
        >>> bf16, dropit = (MeasuredSettings(name, [name], None, str, None, None, simple=simple)
        ...                 for name, simple in (('bf16', True), ('dropit', False)))
        >>> level = exactness([bf16, dropit, MicroBatches(8, seconds_of=float)])
        >>> start = Estimate(100, 800)
        >>> [level(start.choose(Choice(*names, names[0]), 400, 1.0))
        ...  for names in [('micro-batches', 2), ('bf16', 'bf16'), ('dropit', 'dropit')]]
        [0, 1, 2]
    """
    lossy = {technique.name for technique in techniques if technique.lossy}
    not_simple = {technique.name for technique in techniques
                  if technique.lossy and not technique.simple}

    def level(estimate: Estimate) -> int:
        names = {choice.technique for choice in estimate.choices}
        return 2 if names & not_simple else 1 if names & lossy else 0

    return level


def _baselines(considered: Sequence[Estimate], budget_bytes: int, trials: Trials,
               start: Estimate, nothing_fits: bool,
               level: Callable[[Estimate], int]) -> list[Estimate]:
    """What the search's choice is always measured beside, where predicted to fit: the step
    with nothing applied, the fastest exact combination, the fastest with per-block
    checkpointing, and the :data:`SIMPLE_BASELINES` fastest whose lossy techniques are all
    :attr:`~.techniques.Technique.simple` (the simple recipe in bf16)."""
    fitting = _predicted_to_fit(considered, budget_bytes)
    per_block = trials.plans.per_block
    found = [start] if nothing_fits else []
    for wanted, count in ((lambda e: level(e) == 0, 1),
                          (lambda e: per_block is not None and
                           e.setting('checkpoint-plan') is per_block, 1),
                          (lambda e: level(e) == 1, SIMPLE_BASELINES)):
        found += [e for e in fitting if wanted(e)][:count]
    return found


def _median_seconds(estimates: Sequence[Estimate], seconds: Callable[[Estimate], float],
                    first_seconds: Callable[[Estimate], float] | None = None,
                    nothing: Estimate | None = None
                    ) -> tuple[dict[str, float], list[Estimate]]:
    """The median of up to :data:`ROUNDS` step times of each of ``estimates``, timed in turn (a
    drift of the machine's speed reaches them all alike); after two rounds one that another
    beat by more than :data:`CLEAR_LEAD` in both is not timed again (:func:`_beaten`), and the
    timing ends where one is left. Nothing is timed for one alone. The first round's times come
    from ``first_seconds`` (default ``seconds``): a time measured earlier in the run, where the
    same passes were timed before (:meth:`~.trials.Trials.first_seconds`), counts as a round.

    Returns:
        The medians by summary, and the contenders: those not left out (the choice is made
        among them only: a median over two rounds is not compared with one over three, where
        one slow third round could make the one that led in both look no faster). Where
        ``nothing`` (the step with nothing applied, one of ``estimates``) is left out, only
        those that led it by more than :data:`NOTHING_PREFERENCE` in each of its rounds: the
        one that left it out did, and so did any that left that one out in turn."""
    if len(estimates) < 2:
        return {}, list(estimates)
    times: dict[str, list[float]] = {estimate.summary: [] for estimate in estimates}
    racing = list(estimates)
    for round_ in range(ROUNDS):
        timer = first_seconds if first_seconds is not None and round_ == 0 else seconds
        for estimate in racing:
            times[estimate.summary].append(timer(estimate))
        if round_ >= 1:
            racing = [e for e in racing if not _beaten(e, racing, times)]
            if len(racing) < 2:
                break
    if nothing is not None and all(e.summary != nothing.summary for e in racing):
        racing = [e for e in racing if _led(e, nothing, times, NOTHING_PREFERENCE)]
    return {summary: statistics.median(taken) for summary, taken in times.items()}, racing


def _beaten(estimate: Estimate, racing: Sequence[Estimate], times: dict[str, list[float]]
            ) -> bool:
    """Whether another of ``racing`` (timed in the same rounds) was faster than ``estimate`` by
    more than :data:`CLEAR_LEAD` in every round: a further round could not make ``estimate``
    the faster by more than the noise, nor clear the 5% or 10% that a less exact combination,
    or any against nothing applied, must lead by (:data:`~.search.EXACT_PREFERENCE`,
    :data:`NOTHING_PREFERENCE`)."""
    return any(_led(e, estimate, times, CLEAR_LEAD)
               for e in racing if e.summary != estimate.summary)


def _led(leader: Estimate, estimate: Estimate, times: dict[str, list[float]],
         factor: float) -> bool:
    """Whether ``leader`` was faster than ``estimate`` by more than ``factor`` in every round
    both were timed in."""
    return all(theirs * factor < mine
               for theirs, mine in zip(times[leader.summary], times[estimate.summary]))


def _preferred(fitting: Sequence[Estimate], timed: dict[str, float],
               level: Callable[[Estimate], int], nothing: Estimate | None) -> Estimate:
    """The combination to train with among those measured to fit and not left out of the timing
    (see :func:`choose_measured`; ``level`` is :func:`exactness`; ``nothing``: the step with
    nothing applied where it fits, which counts only where it is among them: left out, the
    others all led it clearly, :func:`_median_seconds`)."""
    if nothing is not None:
        nothing = next((e for e in fitting if e.summary == nothing.summary), None)
    if len(fitting) == 1:
        return fitting[0]
    best: Estimate | None = None
    for exact_as in range(3):  # the most exact first: a less exact one must be clearly faster
        fastest = min((e for e in fitting if level(e) == exact_as),
                      key=lambda e: timed[e.summary], default=None)
        if fastest is not None and (best is None or timed[fastest.summary] * EXACT_PREFERENCE
                                    < timed[best.summary]):
            best = fastest
    if nothing is not None and best.summary != nothing.summary and \
            timed[best.summary] * NOTHING_PREFERENCE >= timed[nothing.summary]:
        return nothing
    return best
