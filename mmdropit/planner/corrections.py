"""What measured misses teach a search: how far measured activations were above their
prediction (:class:`Corrections`), and whether a corrected prediction fits (:func:`fits_within`).

Example:
    >>> from .estimate import Choice, Estimate
    >>> corrections = Corrections(limit=1000, lossy=frozenset({'bf16'}))
    >>> exact = Estimate(200, 700)
    >>> corrections.fits(exact)
    True
    >>> corrections.learn(exact, peak=1250)          # activations measured 1.5 times predicted
    >>> corrections.overall, corrections.fits(exact)
    (1.5, False)
    >>> lossy = exact.choose(Choice('bf16', 'bf16', 'bf16'), 400, 0.8)
    >>> corrections.learn(lossy, peak=1000)          # only for combinations with bf16
    >>> corrections.by_lossy_choices
    {frozenset({'bf16'}): 2.0}
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .estimate import Estimate


def fits_within(estimate: Estimate, limit: int, correction: float = 1.0) -> bool:
    """Whether ``estimate``'s predicted peak, its activations multiplied by ``correction``, is
    at most ``limit``."""
    return estimate.fixed_bytes + estimate.activation_bytes * correction <= limit


@dataclass
class Corrections:
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
