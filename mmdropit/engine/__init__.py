"""The MMEngine side of mmdropit: everything here registers into MMEngine's root registries.

- :mod:`.hooks`: ``DropITHook``, ``CheckpointPlanHook``, ``MemoryReportHook``;
- :mod:`.optim`: ``MicroBatchOptimWrapper``, ``MixedPrecisionOptimWrapper``;
- :mod:`.fsdp`: FSDP2 / FSDP1 model wrappers, the ``FlexibleRunner`` strategy, full-state
  checkpoints;
- :mod:`.classification`: ``TimmClassifier``, its data preprocessor, datasets, pipeline steps and
  metric.

Root registries are the parents of every OpenMMLab scope, so ``type='TimmClassifier'`` or
``type='MemoryReportHook'`` resolves with ``default_scope='mmdet'`` and with no scope.
Importing this package also installs the :mod:`.compat` shims (mmengine 0.10.7 on torch 2.13).
``import mmdropit`` imports it whenever mmengine is installed.
"""
from . import compat

compat.install_all()

from . import classification, fsdp, hooks, optim  # noqa: E402  (after the shims)

__all__ = ['classification', 'compat', 'fsdp', 'hooks', 'optim']
