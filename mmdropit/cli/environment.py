"""Check that the compiled parts of the stack load, with a message that says what to do."""
from __future__ import annotations

import importlib.util
from collections.abc import Mapping

import torch

from ..errors import EnvironmentProblem

REBUILD_HINT = ('rebuild it for this torch: `pip uninstall -y mmcv && MMCV_WITH_OPS=1 pip install '
                '--no-build-isolation --no-cache-dir mmcv==2.1.0` (or run `make env`)')


def needs_mmcv_ops(cfg: Mapping) -> bool:
    """Whether a config builds MMDetection's models (their heads call mmcv's compiled ops):
    its registry scope is ``mmdet`` or it imports an mmdet module. A timm or MMEngine model
    runs with an mmcv installed without ops (``MMCV_WITH_OPS=0``).

    Example:
        >>> needs_mmcv_ops({'default_scope': 'mmdet'}), needs_mmcv_ops({'default_scope': None})
        (True, False)
        >>> needs_mmcv_ops({'custom_imports': {'imports': ['mmdet.models', 'mmdropit']}})
        True
    """
    imports = (cfg.get('custom_imports') or {}).get('imports', [])
    if isinstance(imports, str):
        imports = [imports]
    return (cfg.get('default_scope') == 'mmdet'
            or any(name.split('.')[0] == 'mmdet' for name in imports))


def mmcv_ops_installed() -> bool:
    """Whether mmcv's compiled ops are there to load (MMEngine imports them when they are, a
    broken build then fails any model); ``False`` for mmcv built with ``MMCV_WITH_OPS=0`` or no
    mmcv at all."""
    try:
        return importlib.util.find_spec('mmcv._ext') is not None
    except ModuleNotFoundError:
        return False
    except ImportError:  # there, but it cannot be looked at: broken
        return True


def require_mmcv_ops() -> None:
    """Import mmcv's compiled ops (mmdet's detectors need them).

    Raises:
        EnvironmentProblem: mmcv is missing, was installed without its ops, or its ops
            were compiled against another torch (undefined symbols).
    """
    try:
        import mmcv  # noqa: F401
    except ImportError as exc:
        raise EnvironmentProblem(
            f'mmcv is not installed ({exc}); install mmcv 2.1.0 with its compiled ops: '
            '`make env`') from exc
    try:
        from mmcv.ops import nms  # noqa: F401
    except (ImportError, OSError) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise EnvironmentProblem(
            f'mmcv {mmcv.__version__} is installed but its compiled ops do not load with '
            f'torch {torch.__version__} ({reason}); {REBUILD_HINT}') from exc
