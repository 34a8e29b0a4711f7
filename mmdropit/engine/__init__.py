"""The MMEngine side of mmdropit: everything here registers into MMEngine's root registries.

Root registries are the parents of every OpenMMLab scope, so ``type='TimmClassifier'`` or
``type='MemoryReportHook'`` resolves with ``default_scope='mmdet'`` and with no scope.
Importing this package also installs the :mod:`.compat` shims.
"""
from . import compat

compat.install_all()

from . import datasets, evaluation, fsdp, hooks, models, optim  # noqa: E402  (after the shims)

__all__ = ['compat', 'datasets', 'evaluation', 'fsdp', 'hooks', 'models', 'optim']
