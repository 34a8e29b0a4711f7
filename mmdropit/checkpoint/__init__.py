"""Checkpoint plans: record a real training step, predict its memory, search and apply a plan.

Pure PyTorch (no mmengine). The pieces, in the order they run:

- :mod:`.record`: one eager forward pass under module hooks and saved-tensor hooks, and
  :mod:`.step_record` what it saw;
- :mod:`.chain`: the chain of module calls and the segments a checkpoint can cover;
- :mod:`.cost`: the peak and recompute time of a step under a plan;
- :mod:`.selective` and :mod:`.nested`: two more ways to cover a segment (keep its costly ops'
  outputs; checkpoint a plan of shorter segments inside it);
- :mod:`.solver`: exact least-memory and least-time-under-budget searches;
- :mod:`.targets`: what a checkpoint is put on (a module, a run of an ``nn.Sequential``'s
  children, or a run of siblings that pass a tensor on), and its plan-file form;
- :mod:`.apply` and :mod:`.plan`: the plan object, applied in place; :mod:`.first_pass`: what
  a recomputation starts from; :mod:`.per_block`: the plan of every repeated block, to compare
  searched plans with.

Example::

    plan = mmdropit.plan_checkpoints(model, step, budget=0.5)
    plan.apply(model)
"""
from .apply import (checkpoint_module, checkpoint_run, checkpoint_siblings, is_checkpointed,
                    uncheckpoint, uncheckpoint_all)
from .chain import DEFAULT_GRANULARITY, Chain, Item, Segment, build_chain
from .cost import ChainCosts, Prediction, SegmentCost, chain_costs, predict
from .nested import with_nested
from .per_block import per_block_plan
from .plan import (BUDGET_HELP, CheckpointPlan, forward_link_bytes, plan_checkpoints,
                   plan_for_chain)
from .record import record_step
from .step_record import ModuleCall, StepRecord
from .selective import COSTLY_OPS, selective_contexts
from .solver import fits, least_peak, least_time
from .targets import (ModuleTarget, RunTarget, SiblingsTarget, Target, targets_from_json,
                      targets_to_json)

__all__ = [
    'BUDGET_HELP', 'COSTLY_OPS', 'Chain', 'ChainCosts', 'CheckpointPlan', 'DEFAULT_GRANULARITY',
    'Item', 'ModuleCall', 'ModuleTarget', 'Prediction', 'RunTarget', 'Segment', 'SegmentCost',
    'SiblingsTarget', 'StepRecord', 'Target', 'build_chain', 'chain_costs', 'checkpoint_module',
    'checkpoint_run', 'checkpoint_siblings', 'fits', 'forward_link_bytes', 'is_checkpointed',
    'least_peak', 'least_time', 'per_block_plan', 'plan_checkpoints', 'plan_for_chain', 'predict',
    'record_step', 'selective_contexts', 'targets_from_json', 'targets_to_json', 'uncheckpoint',
    'uncheckpoint_all', 'with_nested',
]
