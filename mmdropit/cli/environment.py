"""Check that the compiled parts of the stack load, with a message that says what to do."""
from __future__ import annotations

import torch

from ..errors import EnvironmentProblem

REBUILD_HINT = ('rebuild it for this torch: `pip uninstall -y mmcv && MMCV_WITH_OPS=1 pip install '
                '--no-build-isolation --no-cache-dir mmcv==2.1.0` (or run `make env`)')


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
