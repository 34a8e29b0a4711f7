"""A predicted training step: the bytes that stay, the activations, the time, and the choices
that led there.

Example:
    >>> start = Estimate(fixed_bytes=400, activation_bytes=600)
    >>> half = start.choose(Choice('micro-batches', 2, '2 micro-batches of 8'), 300, 1.05)
    >>> half.peak_bytes, half.time_ratio, half.summary
    (700, 1.05, '2 micro-batches of 8')
"""
from __future__ import annotations

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
class Estimate:
    """What a training step is expected to hold at its peak, and how long it takes.

    Attributes:
        fixed_bytes: Bytes that no activation technique changes: parameters, gradients,
            buffers, optimizer state.
        activation_bytes: Activations and temporaries at the step's peak (of the largest
            micro-batch when the batch is split).
        time_ratio: Step time relative to the step without any technique.
        choices: The techniques' settings, in the order they were chosen.
        lossy_ratio: The share of the activations that the lossy choices left (1 without
            any); ``activation_bytes / lossy_ratio`` is what they would be without them.
    """

    fixed_bytes: int
    activation_bytes: int
    time_ratio: float = 1.0
    choices: tuple[Choice, ...] = ()
    lossy_ratio: float = 1.0

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
