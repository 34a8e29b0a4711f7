"""The techniques a memory budget combines, one entry each behind :class:`Technique`.

An entry offers its candidate settings on top of an :class:`~.estimate.Estimate` (the step as
the techniques before it left it), each with its predicted activations and time, and applies or
removes a setting on a :class:`Target` (the model and whatever runs the training step). A new
technique is a new entry; the search (:mod:`.search`) does not change.

- :class:`MicroBatches`: the batch as ``m`` micro-batches; activations scale with the largest
  part, time with the measured time of its passes.
- :class:`~.checkpoint_plans.CheckpointPlans` (its own module): the fastest checkpoint plan
  whose predicted activations fit what the budget leaves, from a recorded step
  (:mod:`mmdropit.checkpoint`), and per-block checkpointing;
- :class:`MeasuredSettings`: a technique whose few settings were each measured on the step
  (bf16 autocast, DropIT at a few gammas): activations and time scale by the measured ratios.
"""
from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import Protocol

from torch import nn

from ..errors import ConfigError
from ..microbatch import micro_batch_sizes
from .estimate import Choice, Effect, Estimate


class Target(Protocol):
    """What the techniques are applied to: the unwrapped model, and the split of the batch."""

    model: nn.Module

    def set_micro_batches(self, count: int) -> None:
        """Run every following batch as ``count`` micro-batches."""


class Technique(ABC):
    """One memory technique: its candidate settings and how to apply and remove one.

    Attributes:
        name: How decisions name it.
        lossy: Whether it changes the computed gradients (tried only when the user allows it).
        slows_only: Whether its candidates are never faster than the step they start from (the
            search then skips starting points slower than a fitting combination).
        simple: Whether the simple recipe (bf16 autocast, per-block checkpointing,
            micro-batches) uses it: the fastest combination whose lossy techniques are all
            simple is measured in every shortlist (:mod:`.shortlist`).
    """

    name: str
    lossy: bool = False
    slows_only: bool = False
    simple: bool = False

    @abstractmethod
    def candidates(self, estimate: Estimate, budget_bytes: int) -> Iterator[Estimate]:
        """``estimate`` under each setting worth trying for ``budget_bytes`` (leaving the
        technique out, when that is a candidate, yields ``estimate`` itself)."""

    @abstractmethod
    def apply(self, setting: object, target: Target) -> None:
        """Put ``setting`` in effect on ``target``."""

    @abstractmethod
    def remove(self, target: Target) -> None:
        """Undo :meth:`apply` (a no-op when nothing is applied)."""

    def encode(self, setting: object) -> object:
        """``setting`` as JSON (to save a decision)."""
        return setting

    def decode(self, value: object) -> object:
        """The setting that :meth:`encode` gave ``value`` for."""
        return value


class MicroBatches(Technique):
    """Run the batch as 1, 2, 4, ... micro-batches (and one per sample).

    Activations are predicted to scale with the largest part's share of the batch; the time of
    ``m`` micro-batches is the measured time of their passes over that of the whole batch. A
    count whose passes fail (BatchNorm cannot train on a single sample) is not offered.

    Args:
        batch_size: Samples in the batch.
        seconds_of: ``seconds_of(size)``: the measured time of a forward and backward pass of
            ``size`` samples (called for every candidate: memoize it).
        undivided_saving: Bytes the undivided batch does not hold at its peak that every
            micro-batch after the first does: the gradients left by the parts before it (the
            estimates come in with them held; 0 when gradients accumulate over batches anyway).

    Example:
        >>> technique = MicroBatches(8, seconds_of=lambda size: 1.0 + size)
        >>> [(e.activation_bytes, round(e.time_ratio, 2)) for e in
        ...  technique.candidates(Estimate(100, 800), budget_bytes=600)]
        [(800, 1.0), (400, 1.11), (200, 1.33), (100, 1.78)]
    """

    name = 'micro-batches'

    def __init__(self, batch_size: int, seconds_of: Callable[[int], float],
                 undivided_saving: int = 0) -> None:
        self.batch_size = batch_size
        self.seconds_of = seconds_of
        self.undivided_saving = undivided_saving

    def counts(self) -> list[int]:
        """The micro-batch counts offered: powers of two below the batch size, and one per
        sample."""
        counts = [2**k for k in range(int(math.log2(self.batch_size)) + 1)]
        return sorted({*counts, self.batch_size})

    def candidates(self, estimate: Estimate, budget_bytes: int) -> Iterator[Estimate]:
        whole = self.seconds_of(self.batch_size)
        for count in self.counts():
            if count == 1:
                yield replace(estimate, fixed_bytes=estimate.fixed_bytes - self.undivided_saving)
                continue
            parts = micro_batch_sizes(self.batch_size, count)
            largest = parts[0]
            try:
                seconds = sum(self.seconds_of(size) for size in parts)
            except (RuntimeError, ValueError):  # e.g. BatchNorm cannot train on one sample
                continue
            choice = Choice(self.name, count, f'{count} micro-batches of at most {largest}')
            yield estimate.choose(choice, estimate.activation_bytes * largest // self.batch_size,
                                  estimate.time_ratio * seconds / whole)

    def apply(self, setting: object, target: Target) -> None:
        target.set_micro_batches(int(setting))

    def remove(self, target: Target) -> None:
        target.set_micro_batches(1)

    def decode(self, value: object) -> object:
        """A saved micro-batch count, if it is one this batch offers.

        Raises:
            ConfigError: For any other value.
        """
        if isinstance(value, bool) or value not in self.counts():
            raise ConfigError(f'{value!r} micro-batches: this batch of {self.batch_size} '
                              f'splits into {", ".join(map(str, self.counts()))}')
        return value


class MeasuredSettings(Technique):
    """A technique with a few settings, each measured on the step (e.g. bf16 autocast, DropIT
    at gammas 0.5 / 0.7 / 0.9): a setting scales the activations and the time by its measured
    :class:`~.estimate.Effect`.

    Args:
        name: The technique's name.
        settings: The settings, in the order offered.
        effect_of: Measures a setting's effect (called once per setting, when the settings are
            first offered); ``None`` leaves the setting out (it ran out of memory).
        text: How the decision table names a setting.
        apply: Puts a setting in effect.
        remove: Undoes it.
        lossy: Whether the settings change the computed gradients (bf16, DropIT, quantized
            activations do; activation offload does not).
        simple: Whether the simple recipe uses it (bf16 autocast; see :class:`Technique`).

    Example:
        >>> bf16 = MeasuredSettings('bf16', ['bf16'], lambda setting: Effect(0.6, 0.8), str,
        ...                         apply=lambda setting: None, remove=lambda: None)
        >>> [(e.summary, e.activation_bytes, e.time_ratio)
        ...  for e in bf16.candidates(Estimate(100, 500), budget_bytes=400)]
        [('nothing', 500, 1.0), ('bf16', 300, 0.8)]
    """

    def __init__(self, name: str, settings: Sequence[object],
                 effect_of: Callable[[object], Effect | None], text: Callable[[object], str],
                 apply: Callable[[object], None], remove: Callable[[], None],
                 lossy: bool = True, simple: bool = False) -> None:
        self.name = name
        self.lossy = lossy
        self.simple = simple
        self.settings = tuple(settings)
        self._effect_of, self._text, self._apply, self._remove = effect_of, text, apply, remove
        self._effects: dict[object, Effect | None] | None = None

    def effects(self) -> dict[object, Effect | None]:
        """The measured effect of each setting (measured on first use)."""
        if self._effects is None:
            self._effects = {setting: self._effect_of(setting) for setting in self.settings}
        return self._effects

    def candidates(self, estimate: Estimate, budget_bytes: int) -> Iterator[Estimate]:
        yield estimate
        for setting, effect in self.effects().items():
            if effect is not None:
                chosen = estimate.choose(Choice(self.name, setting, self._text(setting)),
                                         int(estimate.activation_bytes * effect.activation_ratio),
                                         estimate.time_ratio * effect.time_ratio)
                yield replace(chosen, fixed_bytes=estimate.fixed_bytes + effect.constant_bytes,
                              lossy=estimate.lossy.then(effect))

    def apply(self, setting: object, target: Target) -> None:
        self._apply(setting)

    def remove(self, target: Target) -> None:
        self._remove()

    def encode(self, setting: object) -> object:
        """A configuration (DropIT's, bf16's, ...) as its JSON; any other setting as its
        position among the settings."""
        if hasattr(setting, 'to_json'):
            return setting.to_json()
        return self.settings.index(setting)

    def decode(self, value: object) -> object:
        """The setting :meth:`encode` gave ``value`` for; a position, as decisions saved
        before the settings were configurations stored every setting, is one too.

        Raises:
            ConfigError: No setting of this run has that configuration or position.
        """
        if isinstance(value, dict):
            found = [s for s in self.settings if hasattr(s, 'to_json') and s.to_json() == value]
        else:
            found = [self.settings[value]] if isinstance(value, int) and \
                0 <= value < len(self.settings) else []
        if not found:
            raise ConfigError(f'the saved memory decision\'s {self.name} setting {value} is not '
                              'among this run\'s settings')
        return found[0]
