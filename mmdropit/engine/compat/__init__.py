"""Fixes for mmengine 0.10.7 on torch 2.13, installed when ``mmdropit`` is imported.

Nothing under site-packages is edited; each shim patches names at run time and is idempotent:

- :mod:`.atomic_files`: checkpoints and ``last_checkpoint`` written to a temporary file and
  renamed, so a kill never leaves a part of one;
- :mod:`.checkpoint_loading`: ``load_from`` / ``resume`` of MMEngine checkpoints under
  ``torch.load(weights_only=True)``;
- :mod:`.cpu_distributed`: ``--launcher pytorch`` with gloo on machines without CUDA;
- :mod:`.installed_packages`: ``mmdet::`` base configs without ``pkg_resources``;
- :mod:`.mmcv_ops_autocast`: mmcv's ``nms`` and ``roi_align`` in float32 under autocast, so
  detectors train with bfloat16 autocast on CPUs;
- :mod:`.stale_scalars`: a resumed run does not log the old run's per-iteration scalars.
"""
from . import (atomic_files, checkpoint_loading, cpu_distributed, installed_packages,
               mmcv_ops_autocast, stale_scalars)


def install_all() -> None:
    """Install every shim (safe to call more than once)."""
    atomic_files.install()
    checkpoint_loading.install()
    cpu_distributed.install()
    installed_packages.install()
    mmcv_ops_autocast.install()
    stale_scalars.install()
