"""The benchmark as a library: workloads, memory-technique variants, the step harness, reports.

- :mod:`.workload` and :mod:`.models`: a model with a fixed synthetic batch (timm DeiT / ResNet /
  DenseNet, mmdet Faster R-CNN, or any MMEngine config's first train batch);
- :mod:`.techniques` and :mod:`.variants`: each memory technique applied to a workload and
  undone, and the catalogue of variants built from them;
- :mod:`.harness`: saved bytes, the step peak and alternated step times of every variant;
- :mod:`.suite`, :mod:`.report` and :mod:`.plot`: a whole run, its table, JSON and plots;
  :mod:`.selection`: which variants a run measures;
- :mod:`.frontier`: every point of a run as (peak, time), dominated or not, ours checked
  against the simple recipe (bf16, per-block checkpointing, micro-batches, compile);
- :mod:`.fsdp`: bytes per process under DDP and FSDP2;
- :mod:`.ogc_table` and :mod:`.compile_budget`: our plans beside the OGC paper's table and
  beside ``torch.compile``'s activation memory budget.

``tools/benchmark.py`` is its command line. Model libraries (timm, mmdet, mmengine) are imported
only when a model that needs them is built.
"""
from .harness import benchmark_workload
from .report import Measurement, compare, markdown_table, write_json
from .suite import SuiteResults, SuiteSettings, run_suite, write_results
from .variants import (BASELINE, BUDGET_VARIANTS, CURVE_VARIANTS, DEFAULT_VARIANTS,
                       MICRO_VARIANTS, Variant, catalogue)
from .workload import Workload

__all__ = ['BASELINE', 'BUDGET_VARIANTS', 'CURVE_VARIANTS', 'DEFAULT_VARIANTS', 'MICRO_VARIANTS',
           'Measurement', 'SuiteResults', 'SuiteSettings', 'Variant', 'Workload',
           'benchmark_workload', 'catalogue', 'compare', 'markdown_table', 'run_suite',
           'write_json', 'write_results']
