"""One memory budget for every technique (pure PyTorch): predict each combination's peak and
time, take the fastest that fits, and prove it with a measurement.

- :mod:`.estimate`: a predicted step (the bytes that stay, the activations, the time);
- :mod:`.techniques`: one entry per technique (micro-batches, measured settings) behind
  :class:`Technique`; :mod:`.checkpoint_plans`: the checkpoint plans' entry (searched plans
  and per-block checkpointing);
- :mod:`.switches`: the settings measured on the step (bf16, DropIT, quantized activations,
  activation offload, rebuilt activations) as :class:`Switch` objects;
- :mod:`.combinations`: every combination of the techniques' candidates, and one put in effect;
- :mod:`.corrections`: what measured misses teach the predictions;
- :mod:`.search`: the choice under a margin and the measured check (:func:`decide`);
  :mod:`.shortlist`: that choice measured beside a shortlist, the fastest measured taken;
  :mod:`.least`: the least measured peak; :mod:`.decision`: the decision and its table;
- :mod:`.probe`: a step measured through a :class:`StepProbe`; :mod:`.measurements`: the
  passes one planning run measures;
- :mod:`.trials`: a candidate (a combination of settings) put in effect, measured and removed
  (:class:`Trials`);
- :mod:`.budget`: the techniques built from the measurements, and the decision put in effect
  (:func:`plan_within_budget`); :mod:`.outcome`: what it measured and decided, as JSON.

The engine's ``MemoryBudgetHook`` measures a training step, builds the techniques and applies
the decision.
"""
from .budget import plan_within_budget
from .checkpoint_plans import CheckpointPlans
from .combinations import combinations, fastest_fitting, put_in_effect, remove_all
from .decision import Decision
from .estimate import Choice, Effect, Estimate
from .measurements import PART_SAMPLES
from .outcome import BudgetOutcome
from .probe import StepProbe
from .search import ATTEMPTS, MARGIN, decide
from .switches import (ACTIVATION_BITS, DROPIT_GAMMAS, OFFLOAD_SHARES, Switch, bf16_switch,
                       config_switch, dropit_switch, offload_switch, quantize_switch,
                       quantize_unavailable, rebuilt_switch)
from .techniques import MeasuredSettings, MicroBatches, Target, Technique
from .trials import Trials

__all__ = ['ACTIVATION_BITS', 'ATTEMPTS', 'BudgetOutcome', 'CheckpointPlans', 'Choice',
           'DROPIT_GAMMAS', 'Decision', 'Effect', 'Estimate', 'MARGIN', 'MeasuredSettings',
           'MicroBatches', 'OFFLOAD_SHARES', 'PART_SAMPLES', 'StepProbe', 'Switch', 'Target',
           'Technique', 'Trials', 'bf16_switch', 'combinations', 'config_switch', 'decide',
           'dropit_switch', 'fastest_fitting', 'offload_switch', 'plan_within_budget',
           'put_in_effect', 'quantize_switch', 'quantize_unavailable', 'rebuilt_switch',
           'remove_all']
