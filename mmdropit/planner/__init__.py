"""One memory budget for every technique (pure PyTorch): predict each combination's peak and
time, take the fastest that fits, and prove it with a measurement.

- :mod:`.estimate`: a predicted step (the bytes that stay, the activations, the time);
- :mod:`.techniques`: one entry per technique (micro-batches, checkpoint plans, measured
  settings such as bf16, DropIT, quantized activations or activation offload) behind
  :class:`Technique`;
- :mod:`.search`: the combinations, the choice under a margin, and the measured check;
- :mod:`.budget`: a step measured through a :class:`StepProbe`, the techniques built from the
  measurements, and the decision put in effect (:func:`plan_within_budget`).

The engine's ``MemoryBudgetHook`` measures a training step, builds the techniques and applies
the decision.
"""
from .budget import (ACTIVATION_BITS, DROPIT_GAMMAS, OFFLOAD_SHARES, PART_SAMPLES,
                     BudgetOutcome, StepProbe, Switch, bf16_switch, dropit_switch,
                     offload_switch, plan_within_budget, quantize_switch)
from .estimate import Choice, Effect, Estimate
from .search import (ATTEMPTS, MARGIN, Decision, combinations, decide, fastest_fitting,
                     put_in_effect, remove_all)
from .techniques import CheckpointPlans, MeasuredSettings, MicroBatches, Target, Technique

__all__ = ['ACTIVATION_BITS', 'ATTEMPTS', 'BudgetOutcome', 'CheckpointPlans', 'Choice',
           'DROPIT_GAMMAS', 'Decision', 'Effect', 'Estimate', 'MARGIN', 'MeasuredSettings',
           'MicroBatches', 'OFFLOAD_SHARES', 'PART_SAMPLES', 'StepProbe', 'Switch', 'Target', 'Technique',
           'bf16_switch', 'combinations', 'decide', 'dropit_switch', 'fastest_fitting',
           'offload_switch', 'plan_within_budget', 'put_in_effect', 'quantize_switch',
           'remove_all']
