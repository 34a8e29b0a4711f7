#!/usr/bin/env bash
# Collect what the GPU machine needs into .gpu/ (git-ignored) for the device tool's `carry`.
#
# Usage: bash tools/gpu/collect.sh [--dry-run]
#   then: run(command='bash tools/gpu/on_device.sh all', carry=['.gpu'])
#
# Wheels for CPython 3.12 / manylinux x86-64 go to .gpu/wheels, mmcv's source archive to
# .gpu/src (see tools/gpu/carry.txt). Needs this machine's package registry; about 7 MB.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
DEST="$ROOT/.gpu"
LIST="$ROOT/tools/gpu/carry.txt"
PY="${MMDROPIT_PYTHON:-$ROOT/.venv/bin/python}"  # has torch: mmcv's sdist metadata imports it
DRY=0
[[ "${1:-}" == "--dry-run" ]] && DRY=1
[[ $# -gt 1 || ( $# -eq 1 && $DRY -eq 0 ) ]] && {
  echo "usage: bash tools/gpu/collect.sh [--dry-run]" >&2; exit 2; }

mapfile -t WHEELS < <(grep -v -e '^#' -e '^source:' -e '^\s*$' "$LIST")
mapfile -t SOURCES < <(sed -n 's/^source: *//p' "$LIST")
PLATFORMS=()
for tag in manylinux_2_28_x86_64 manylinux_2_27_x86_64 manylinux_2_24_x86_64 \
           manylinux_2_17_x86_64 manylinux2014_x86_64 manylinux1_x86_64; do
  PLATFORMS+=(--platform "$tag")
done
export PIP_CONFIG_FILE=/dev/null PIP_FIND_LINKS= PIP_DISABLE_PIP_VERSION_CHECK=1
run() { if (( DRY )); then echo "$*"; else "$@"; fi; }

run mkdir -p "$DEST/wheels" "$DEST/src"
run "$PY" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 \
  --implementation cp "${PLATFORMS[@]}" -d "$DEST/wheels" "${WHEELS[@]}"
run "$PY" -m pip download -q --no-deps --no-binary=:all: --no-build-isolation \
  -d "$DEST/src" "${SOURCES[@]}"
(( DRY )) || echo "collected $(ls "$DEST/wheels" | wc -l) wheels and $(ls "$DEST/src" | wc -l)" \
  "source archive(s) in $DEST ($(du -sh "$DEST" | cut -f1))"
