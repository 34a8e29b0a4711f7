"""mmcv's compiled ops under autocast: run them in float32.

Under bfloat16 autocast on a CPU (``--amp``, ``MixedPrecisionOptimWrapper``) mmdet's detectors
hand bfloat16 boxes and features to mmcv's ``nms`` and ``roi_align``, which have no bfloat16
kernel (``RuntimeError: expected scalar type Float but found BFloat16``). Autocast only knows
torch's own ops, so this shim teaches it these: while autocast is on, their reduced-precision
floating inputs are cast to float32, they run with autocast off, and their floating outputs are
cast back to the inputs' dtype (mmdet writes RoI features into tensors of that dtype). Outside
autocast nothing changes.

Patched (module globals, which the classes and ``batched_nms`` call): ``mmcv.ops.nms.nms``,
``mmcv.ops.nms.soft_nms`` and ``mmcv.ops.roi_align.roi_align``. Without mmcv's compiled ops the
shim does nothing (``tools/train.py`` reports that on its own).
"""
from __future__ import annotations

import functools
import importlib
from collections.abc import Callable

import torch
from torch.utils._pytree import tree_map

OPS = (('mmcv.ops.nms', 'nms'), ('mmcv.ops.nms', 'soft_nms'), ('mmcv.ops.roi_align', 'roi_align'))
_REDUCED = (torch.float16, torch.bfloat16)


def float32_under_autocast(op: Callable) -> Callable:
    """``op`` that, while autocast is on for its inputs' device, gets float32 copies of its
    float16 / bfloat16 tensor arguments, runs with autocast off, and gives its floating outputs
    back in the first such argument's dtype."""
    if getattr(op, '_mmdropit_float32', False):
        return op

    @functools.wraps(op)
    def run(*args, **kwargs):
        tensors = [value for value in (*args, *kwargs.values()) if isinstance(value, torch.Tensor)]
        device_type = tensors[0].device.type if tensors else 'cpu'
        reduced = [t.dtype for t in tensors if t.dtype in _REDUCED]
        if not reduced or not torch.is_autocast_enabled(device_type):
            return op(*args, **kwargs)
        args, kwargs = tree_map(
            lambda value: value.float() if isinstance(value, torch.Tensor)
            and value.dtype in _REDUCED else value, (args, kwargs))
        with torch.autocast(device_type, enabled=False):
            output = op(*args, **kwargs)
        return tree_map(lambda value: value.to(reduced[0]) if isinstance(value, torch.Tensor)
                        and value.is_floating_point() else value, output)

    run._mmdropit_float32 = True
    return run


def install() -> None:
    """Patch :data:`OPS` (safe to call more than once)."""
    for module_name, name in OPS:
        try:
            module = importlib.import_module(module_name)
        except (ImportError, OSError):  # mmcv without its compiled ops
            return
        setattr(module, name, float32_under_autocast(getattr(module, name)))
