from .activation_offload_hook import ActivationOffloadHook
from .checkpoint_plan_hook import CheckpointPlanHook
from .compress_activations_hook import CompressActivationsHook
from .dropit_hook import DropITHook
from .graph_int8_hook import GraphInt8Hook
from .memory_budget_hook import MemoryBudgetHook
from .memory_report_hook import MemoryReportHook
from .rebuilt_activations_hook import RebuiltActivationsHook

__all__ = ['ActivationOffloadHook', 'CheckpointPlanHook', 'CompressActivationsHook', 'DropITHook',
           'GraphInt8Hook', 'MemoryBudgetHook', 'MemoryReportHook', 'RebuiltActivationsHook']
