"""The memory budget's candidates put in effect, measured and removed (:class:`Trials`).

A candidate is an :class:`~.estimate.Estimate`: a combination of technique settings (its
``choices``; DropIT, quantized activations and offload as their configurations, micro-batches
as a count, a checkpoint plan as a :class:`~mmdropit.checkpoint.CheckpointPlan`). :class:`Trials`
is the one interface through which a planning run puts a candidate in effect on its target,
measures its peak and its time, and takes every technique away again.
"""
from __future__ import annotations

from collections import Counter
from collections.abc import Sequence

from ..checkpoint.chain import Chain
from ..common.parameters import model_device
from ..offload import host_link
from ..microbatch import micro_batch_sizes
from .combinations import put_in_effect, remove_all
from .estimate import Estimate
from .measurements import Measurements
from .switches import Switch
from .checkpoint_plans import CheckpointPlans
from .techniques import MicroBatches, Target, Technique


class Trials:
    """The techniques of one planning run, and their combinations put in effect on the target
    and measured.

    Args:
        measurements: The step's passes measured in this run.
        switches: The techniques whose settings are measured on the step.
        target: What the techniques are applied to.
        nested: Whether checkpoint plans may nest checkpoints
            (:class:`~.checkpoint_plans.CheckpointPlans`).
        inputs_on_host: Whether checkpoint plans are also offered with their inputs in host
            memory (on a GPU only, where the host link is measured for them).

    Attributes:
        micro_batches: The micro-batches technique.
        plans: The checkpoint plans technique.
        techniques: The switches', micro-batches and checkpoint plans, in the order they are
            applied.
        budget_bytes: The budget the combinations are measured for (``None``: the least peak).
        out_of_memory: The combinations whose last measured pass ran out of memory (by
            summary).
    """

    def __init__(self, measurements: Measurements, switches: Sequence[Switch],
                 target: Target, nested: bool = True, inputs_on_host: bool = False) -> None:
        self.measurements, self.target = measurements, target
        probe = measurements.probe
        self.micro_batches = MicroBatches(probe.batch_size, measurements.seconds_of)
        self.plans = CheckpointPlans(
            self.record_plain_step, measurements.part_seconds, probe.model, nested,
            host_link(model_device(probe.model)) if inputs_on_host else None,
            lambda: measurements.seconds_of(probe.batch_size),
            lambda: measurements.part / probe.batch_size)
        self.techniques: list[Technique] = [
            *(measurements.technique(switch) for switch in switches), self.micro_batches,
            self.plans]
        self.budget_bytes: int | None = 0
        self.out_of_memory: set[str] = set()

    def record_plain_step(self) -> Chain:
        """The step recorded on :attr:`~.measurements.Measurements.part` samples, every
        technique removed first (a measured combination may still be in effect)."""
        self.remove_all()
        return self.measurements.probe.chain(self.measurements.part)

    def remove_all(self) -> None:
        """Remove every technique from the target."""
        remove_all(self.techniques, self.target)

    def peak(self, estimate: Estimate) -> int:
        """Put ``estimate`` in effect and measure the peak of its largest pass (gradients held
        when the batch is split). Out of memory measures twice the budget (twice the step's
        peak for the least peak): the search halves its target, and ranks it last."""
        put_in_effect(estimate, self.techniques, self.target)
        probe = self.measurements.probe
        size = self._parts(estimate)[0]
        peak = probe.peak(size, gradients_held=size < probe.batch_size)
        if peak is None:
            self.out_of_memory.add(estimate.summary)
            return 2 * (self.budget_bytes or self.measurements.whole)
        self.out_of_memory.discard(estimate.summary)  # one that ran out before: it fits now
        return peak

    def seconds(self, estimate: Estimate) -> float:
        """Put ``estimate`` in effect and measure its step time as a ratio to the step's with
        nothing applied, each micro-batch size timed as the combination's measured pass warmed
        it up (:meth:`~.probe.StepProbe.seconds_once_warm`)."""
        put_in_effect(estimate, self.techniques, self.target)
        probe = self.measurements.probe
        sizes = Counter(self._parts(estimate))
        passes = sum(count * probe.seconds_once_warm(size) for size, count in sizes.items())
        return passes / self.measurements.seconds_of(probe.batch_size)

    def first_seconds(self, estimate: Estimate) -> float:
        """The step time of ``estimate`` as :meth:`seconds` measures it, taken from passes
        already timed where it applies nothing but micro-batches and each of their sizes has
        been timed with nothing applied (:meth:`~.measurements.Measurements.timed`: the passes
        the sizes' predictions came from, those :meth:`seconds` would time again). Any other
        combination is put in effect and timed."""
        if any(choice.technique != self.micro_batches.name for choice in estimate.choices):
            return self.seconds(estimate)
        measurements = self.measurements
        timed = [measurements.timed(size)
                 for size in (*self._parts(estimate), measurements.probe.batch_size)]
        if None in timed:
            return self.seconds(estimate)
        return sum(timed[:-1]) / timed[-1]

    def _parts(self, estimate: Estimate) -> list[int]:
        """The sizes of the passes ``estimate`` runs the batch as, largest first."""
        return micro_batch_sizes(self.measurements.probe.batch_size,
                                 estimate.setting('micro-batches', 1))
