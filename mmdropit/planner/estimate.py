"""A predicted training step: the bytes that stay, the activations, the time, and the choices
that led there; and the :class:`Effect` of a lossy setting on a measured step.

Example:
    >>> start = Estimate(fixed_bytes=400, activation_bytes=600)
    >>> half = start.choose(Choice('micro-batches', 2, '2 micro-batches of 8'), 300, 1.05)
    >>> half.peak_bytes, half.time_ratio, half.summary
    (700, 1.05, '2 micro-batches of 8')
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace


@dataclass(frozen=True)
class Choice:
    """One technique's setting in a combination.

    Attributes:
        technique: The technique's name, e.g. ``'micro-batches'``.
        setting: What its ``apply`` needs (a number of micro-batches, a checkpoint plan).
        text: How the decision table shows it.
    """

    technique: str
    setting: object
    text: str


@dataclass(frozen=True)
class Effect:
    """What lossy settings did to a measured step, as ratios to the step without them.

    Attributes:
        activation_ratio: Activations and temporaries at the step's peak.
        time_ratio: Step time.
        constant_bytes: Bytes they add whatever the batch size (bf16 autocast's cast copies of
            the weights): counted with the state's, so micro-batches do not scale them (nor do
            checkpoint plans, though a plan may free some of them: see
            :attr:`Estimate.freeable_bytes`).
    """

    activation_ratio: float = 1.0
    time_ratio: float = 1.0
    constant_bytes: int = 0

    @classmethod
    def from_peaks(cls, without: Sequence[int], with_it: Sequence[int], time_ratio: float
                   ) -> Effect:
        """The effect that turns activations ``without`` into ``with_it`` (each measured at
        one or two batch sizes, smaller first, the state's bytes left out): a ratio of the
        activations plus constant bytes, fitted through both sizes.

        Example:
            >>> Effect.from_peaks([100, 800], [80, 430], 0.5)   # half the activations, +30
            Effect(activation_ratio=0.5, time_ratio=0.5, constant_bytes=30)
            >>> Effect.from_peaks([800], [400], 1.1)
            Effect(activation_ratio=0.5, time_ratio=1.1, constant_bytes=0)
        """
        large, large_with = without[-1], with_it[-1]
        if len(without) > 1 and large > without[0]:
            ratio = max((large_with - with_it[0]) / (large - without[0]), 0.0)
            constant = int(large_with - ratio * large)
            if constant >= 0:
                return cls(ratio, time_ratio, constant)
        return cls(max(large_with, 0) / max(large, 1), time_ratio)

    def then(self, other: Effect) -> Effect:
        """This effect, and ``other`` on top of it."""
        return Effect(self.activation_ratio * other.activation_ratio,
                      self.time_ratio * other.time_ratio,
                      self.constant_bytes + other.constant_bytes)


@dataclass(frozen=True)
class Estimate:
    """What a training step is expected to hold at its peak, and how long it takes.

    Attributes:
        fixed_bytes: Bytes that no activation technique changes: parameters, gradients,
            buffers, optimizer state.
        activation_bytes: Activations and temporaries at the step's peak (of the largest
            micro-batch when the batch is split).
        time_ratio: Step time relative to the step without any technique.
        choices: The techniques' settings, in the order they were chosen.
        lossy: What the lossy choices did together (nothing without any):
            ``activation_bytes / lossy.activation_ratio`` is what the activations would be
            without them.
        freeable_bytes: Bytes the prediction counts that the combination may not hold (the
            lossy settings' constant bytes under a checkpoint plan, which frees the cast
            weights that DropIT's layers, and some of autocast's, keep): the search measures a
            faster combination predicted over the budget by no more than these.
    """

    fixed_bytes: int
    activation_bytes: int
    time_ratio: float = 1.0
    choices: tuple[Choice, ...] = ()
    lossy: Effect = Effect()
    freeable_bytes: int = 0

    @property
    def peak_bytes(self) -> int:
        """The predicted peak of the step."""
        return self.fixed_bytes + self.activation_bytes

    @property
    def summary(self) -> str:
        """The choices as one line (``'nothing'`` without any)."""
        return ' + '.join(choice.text for choice in self.choices) or 'nothing'

    def choose(self, choice: Choice, activation_bytes: int, time_ratio: float) -> Estimate:
        """This estimate with ``choice`` added and its predicted activations and time."""
        return replace(self, activation_bytes=activation_bytes, time_ratio=time_ratio,
                       choices=(*self.choices, choice))

    def setting(self, technique: str, default: object = None) -> object:
        """The setting chosen for ``technique`` (``default`` when it was not chosen)."""
        return next((c.setting for c in self.choices if c.technique == technique), default)
