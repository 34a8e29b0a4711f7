"""Let MMEngine run distributed on CPUs (gloo).

MMEngine 0.10.7 calls ``torch.cuda.set_device`` before ``init_process_group`` whatever the
backend, and wraps the model in DDP with ``device_ids=[LOCAL_RANK]``; both fail on a
machine without CUDA. With this shim, ``--launcher pytorch`` on CPUs initialises a gloo
process group (``nccl`` in a config becomes ``gloo``) and DDP gets ``device_ids=None``.

A CPU process group waits :data:`CPU_TIMEOUT` for a rank that does not answer, not PyTorch's
30 minutes, unless the config says otherwise::

    env_cfg = dict(dist_cfg=dict(backend='gloo', timeout=1800))  # seconds
"""
from __future__ import annotations

import datetime
import functools

import torch

CPU_TIMEOUT = datetime.timedelta(minutes=10)


def _init_dist_pytorch_cpu_aware(original):
    @functools.wraps(original)
    def init_dist_pytorch(backend: str = 'nccl', init_backend: str = 'torch', **kwargs):
        if torch.cuda.is_available() or init_backend != 'torch':
            return original(backend, init_backend=init_backend, **kwargs)
        if backend == 'nccl':
            backend = 'gloo'
        kwargs.setdefault('timeout', CPU_TIMEOUT)
        torch.distributed.init_process_group(backend=backend, **kwargs)

    init_dist_pytorch.__mmdropit_shim__ = True
    return init_dist_pytorch


def _ddp_init_cpu_aware(original):
    @functools.wraps(original)
    def __init__(self, module, *args, **kwargs):
        on_cpu = all(p.device.type == 'cpu' for p in module.parameters())
        if on_cpu and kwargs.get('device_ids') is not None:
            kwargs['device_ids'] = None
            kwargs['output_device'] = None
        original(self, module, *args, **kwargs)

    __init__.__mmdropit_shim__ = True
    return __init__


def install() -> None:
    """Patch MMEngine's process-group start and its DDP wrapper for CPU runs."""
    import mmengine.dist.utils as dist_utils
    from mmengine.model.wrappers import MMDistributedDataParallel

    if not getattr(dist_utils._init_dist_pytorch, '__mmdropit_shim__', False):
        dist_utils._init_dist_pytorch = _init_dist_pytorch_cpu_aware(
            dist_utils._init_dist_pytorch)
    if not getattr(MMDistributedDataParallel.__init__, '__mmdropit_shim__', False):
        MMDistributedDataParallel.__init__ = _ddp_init_cpu_aware(
            MMDistributedDataParallel.__init__)
