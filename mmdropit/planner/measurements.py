"""The passes one planning run measures of a step (:class:`Measurements`): the step with
nothing applied at a few sizes, each timed or measured once, and each setting of a
:class:`~.switches.Switch` against them.
"""
from __future__ import annotations

import functools

import torch

from ..errors import ConfigError
from ..memory import state_bytes
from .estimate import Effect
from .probe import StepProbe, per_pass_bytes
from .switches import Switch
from .techniques import MeasuredSettings

PART_SAMPLES = 8
"""Lossy settings are measured, and the step is recorded for checkpoint plans, on half the
batch, at most this many samples (lossy settings also on an eighth of that): these passes are
most of a search at a large batch, and what they give holds at any batch size (a lossy setting's
effect is fitted as a share of the activations plus constant bytes; a plan's saving is a share
of the recorded activations, its recompute time a share of the recorded step's)."""


class Measurements:
    """The step's passes measured in one planning run.

    Args:
        probe: How to measure the step.

    Attributes:
        fixed: Parameters, gradients, buffers and optimizer state.
        part: The samples lossy settings are measured on (with an eighth of them, to tell
            bytes they add whatever the batch, as bf16's cast weights, from a share of the
            activations) and the step is recorded on: half the batch, at most
            :data:`PART_SAMPLES` (fewer where those run out of memory, see
            :meth:`unplanned_peak`).
        whole: The step's peak with nothing applied and gradients held (0 until
            :meth:`unplanned_peak`).
        per_pass: Bytes every pass holds beyond :attr:`fixed` whatever its size
            (:func:`~.probe.per_pass_bytes`; 0 until :meth:`unplanned_peak`).
        warm: The sizes a pass has run at: they are timed as
            :meth:`~.probe.StepProbe.seconds_once_warm`.
        predicted_from: The samples the whole step's peak is predicted from, when its batch
            ran out of memory with nothing applied (0: the whole step was measured; see
            :meth:`unplanned_peak`; its time is then predicted too, :meth:`seconds_of`).
    """

    def __init__(self, probe: StepProbe) -> None:
        self.probe = probe
        self.fixed = state_bytes(probe.model, probe.optimizer)
        self.part = min((probe.batch_size + 1) // 2, PART_SAMPLES)
        self.whole = self.per_pass = self.predicted_from = 0
        self.warm: set[int] = set()
        self._seconds: dict[int, float] = {}
        self._failed: dict[int, RuntimeError | ValueError] = {}
        self._plain_peaks: dict[int, int] = {}
        self._lossy_sizes: list[int] | None = None

    def peak_of(self, size: int) -> int | None:
        """The peak of a pass of ``size`` samples, gradients held (``None``: out of memory)."""
        self.warm.add(size)
        return self.probe.peak(size)

    def seconds_of(self, size: int) -> float:
        """The time of a pass of ``size`` samples, measured once: the fastest of two passes
        when the first may be cold (a size larger than any before, which takes new memory; on
        a GPU any pass, :attr:`~.probe.StepProbe.cold_passes`), else one. A size whose pass
        runs out of memory (the whole batch's, where it did with nothing applied) takes the
        time of its half, found the same way, scaled to it: the largest part that runs.

        Raises:
            RuntimeError, ValueError: The pass failed otherwise (BatchNorm cannot train on one
                sample), or one sample ran out of memory: raised again, without a pass, for
                the same size.
        """
        if size in self._failed:
            raise self._failed[size]
        if size not in self._seconds:
            self._seconds[size] = (
                self._scaled_from_half(size)
                if size == self.probe.batch_size and self.predicted_from
                else self._timed_pass(size))
        return self._seconds[size]

    def _timed_pass(self, size: int) -> float:
        """:meth:`seconds_of` a size not timed before."""
        warm = self.warm
        was_warm = size in warm
        cold = not was_warm and (not warm or size > max(warm))
        warm.add(size)
        try:
            return self.probe.seconds(size) if cold else self.probe.seconds_once_warm(size)
        except torch.OutOfMemoryError as error:
            if not was_warm:  # a pass that ran before at this size warmed it all the same
                warm.discard(size)
            if size > 1:
                return self._scaled_from_half(size)
            self._failed[size] = error
            raise
        except (RuntimeError, ValueError) as error:
            self._failed[size] = error
            raise

    def _scaled_from_half(self, size: int) -> float:
        """The time of half of ``size`` samples (:meth:`seconds_of`), scaled to ``size``."""
        half = -(-size // 2)
        return self.seconds_of(half) * size / half

    def timed(self, size: int) -> float | None:
        """The time :meth:`seconds_of` measured for ``size`` (``None``: not measured yet)."""
        return self._seconds.get(size)

    def part_seconds(self) -> float:
        """The time of a pass of :attr:`part` samples (:meth:`seconds_of`)."""
        return self.seconds_of(self.part)

    def plain_peak(self, size: int) -> int:
        """The peak of a pass of ``size`` samples with nothing applied, measured once (the
        whole step's when ``size`` is the batch, or when the pass runs out of memory)."""
        if size not in self._plain_peaks:
            self._plain_peaks[size] = (self.whole if size == self.probe.batch_size
                                       else self.peak_of(size) or self.whole)
        return self._plain_peaks[size]

    def lossy_sizes(self) -> list[int]:
        """The sizes a lossy setting is measured at, smaller first: an eighth of :attr:`part`
        and :attr:`part`, or :attr:`part` alone when the smaller cannot train."""
        if self._lossy_sizes is None:
            small = max(self.part // 8, 1)
            try:
                self.plain_peak(small)
            except (RuntimeError, ValueError):  # e.g. BatchNorm1d cannot train on one sample
                self._lossy_sizes = [self.part]
            else:
                self._lossy_sizes = sorted({small, self.part})
        return self._lossy_sizes

    def held(self) -> int:
        """What every pass holds anyway: the state, and :attr:`per_pass`."""
        return self.fixed + self.per_pass

    def unplanned_peak(self) -> int:
        """Measure the whole step with nothing applied, as it starts and with gradients held
        (as every later part holds them): sets :attr:`whole` and :attr:`per_pass`.

        Where the whole batch runs out of memory (the step the budget is for may not fit the
        device at all), the step is measured on :attr:`part` samples (where those run out too,
        :attr:`part` becomes the largest of their half, quarter, ... that runs) and its
        peaks are scaled to the batch on the line through one sample's (activations grow with
        the samples, :attr:`per_pass` does not); :attr:`predicted_from` says so.

        Returns:
            The step's peak as it starts (no gradients held, unless gradients accumulate over
            batches).

        Raises:
            ConfigError: One sample runs out of memory.
        """
        batch_size = self.probe.batch_size
        peaks = self.probe.peaks(batch_size)
        if peaks.fresh is None or peaks.held is None:
            return self._predicted_unplanned_peak()
        self.warm.add(batch_size)
        self.whole = peaks.held
        self.per_pass = per_pass_bytes(batch_size, self.whole - self.fixed,
                                       lambda: self.plain_peak(1) - self.fixed)
        return peaks.fresh

    def _predicted_unplanned_peak(self) -> int:
        """:meth:`unplanned_peak` where the whole batch ran out of memory: :attr:`part` becomes
        the largest of it, its half, quarter, ... that runs."""
        batch_size = self.probe.batch_size
        halves = {-(-self.part // 2**k) for k in range(self.part.bit_length() + 1)}
        for size in sorted(halves - {batch_size}, reverse=True):
            peaks = self.probe.peaks(size)
            if peaks.fresh is not None and peaks.held is not None:
                self.warm.add(size)
                break
        else:
            raise ConfigError('one sample ran out of memory with nothing applied: no '
                              'combination of these techniques can train this model here; '
                              'shard it over more devices, or use a device with more memory')
        self.part = self.predicted_from = size
        self._plain_peaks[size] = peaks.held
        self.per_pass = per_pass_bytes(size, peaks.held - self.fixed,
                                       lambda: self.plain_peak(1) - self.fixed)
        self.whole = self.held() + (peaks.held - self.held()) * batch_size // size
        return peaks.fresh + self.whole - peaks.held

    def technique(self, switch: Switch) -> MeasuredSettings:
        """``switch`` as a technique whose settings' effects are measured when first needed
        (:meth:`effect`)."""
        effect_of = functools.partial(self.effect, switch)
        return MeasuredSettings(switch.name, switch.settings, effect_of, switch.text,
                                switch.apply, switch.remove, lossy=switch.lossy,
                                simple=switch.simple)

    def effect(self, switch: Switch, setting: object) -> Effect | None:
        """The effect of ``switch`` at ``setting``: its peaks measured at
        :meth:`lossy_sizes`, and its time at the largest of them, against those of the same
        samples without it (:meth:`plain_peak`, :meth:`part_seconds`), less :meth:`held`
        (:meth:`~.estimate.Effect.from_peaks`). ``None`` when a pass runs out of memory under
        it. Its time is taken as the measured pass warmed it up
        (:meth:`~.probe.StepProbe.seconds_once_warm`): a lossy choice is timed again before it
        is kept."""
        sizes = self.lossy_sizes()
        without = [self.plain_peak(size) - self.held() for size in sizes]  # before it applies
        switch.apply(setting)
        try:
            peaks = [self.probe.peak(size) for size in sizes]
            if None in peaks:
                return None
            duration = self.probe.seconds_once_warm(sizes[-1])
        except torch.OutOfMemoryError:
            return None
        finally:
            switch.remove()
        return Effect.from_peaks(without, [peak - self.held() for peak in peaks],
                                 duration / self.part_seconds())
