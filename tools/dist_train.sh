#!/usr/bin/env bash
# Distributed training with torchrun: bash tools/dist_train.sh CONFIG NPROC [train.py args]
# Multi-node: NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 bash tools/dist_train.sh CONFIG 8
# PORT: the rendezvous port on MASTER_ADDR (29500); PYTHON: run `$PYTHON -m torch.distributed.run`
# instead of the torchrun on PATH.
# On machines without CUDA the processes use gloo (mmdropit's shim).
set -euo pipefail
if [[ $# -lt 2 || ! "$2" =~ ^[1-9][0-9]*$ ]]; then
  echo "usage: bash tools/dist_train.sh CONFIG NPROC [train.py arguments]  (NPROC: processes per machine, e.g. 8)" >&2
  exit 2
fi
CONFIG=$1
NPROC=$2
if [[ ! -f "$CONFIG" ]]; then
  echo "error: config file '$CONFIG' does not exist" >&2
  exit 1
fi
NNODES=${NNODES:-1}
NODE_RANK=${NODE_RANK:-0}
PORT=${PORT:-29500}
MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}
TOOLS_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

if [[ -n "${PYTHON:-}" ]]; then
  LAUNCH=("$PYTHON" -m torch.distributed.run)
elif command -v torchrun >/dev/null; then
  LAUNCH=(torchrun)
else
  VENV="$(dirname "$TOOLS_DIR")/.venv"
  if [[ -x "$VENV/bin/torchrun" ]]; then
    echo "error: torchrun is not on PATH: activate the environment first (source $VENV/bin/activate) or set PYTHON=$VENV/bin/python" >&2
  else
    echo "error: torchrun is not on PATH: activate the Python environment that has torch (\`make env\` makes .venv) or set PYTHON=/path/to/python" >&2
  fi
  exit 127
fi

# exec: a signal to this script reaches torchrun, which stops the training processes
PYTHONPATH="$TOOLS_DIR/..${PYTHONPATH:+:$PYTHONPATH}" \
exec "${LAUNCH[@]}" \
    --nnodes="$NNODES" \
    --node_rank="$NODE_RANK" \
    --master_addr="$MASTER_ADDR" \
    --nproc_per_node="$NPROC" \
    --master_port="$PORT" \
    "$TOOLS_DIR/train.py" "$CONFIG" --launcher pytorch "${@:3}"
