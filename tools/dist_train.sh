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
if [[ ! "$PORT" =~ ^[0-9]+$ ]] || (( PORT < 1 || PORT > 65535 )); then
  echo "error: PORT must be a number from 1 to 65535, got '$PORT'" >&2
  exit 1
fi
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

# Node 0 hosts the rendezvous on PORT: a port in use would fail in torchrun with a long traceback.
# The bind test needs no torch, so any Python does.
CHECKER=${PYTHON:-python3}
if [[ "$NODE_RANK" == 0 ]] && command -v "$CHECKER" >/dev/null; then
  "$CHECKER" - "$PORT" "$CONFIG" "$NPROC" <<'PY'
import errno
import socket
import sys

port, config, nproc = sys.argv[1:]
with socket.socket() as sock:
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as torchrun's store does
    try:
        sock.bind(('', int(port)))
    except OSError as exc:
        with socket.socket() as free:
            free.bind(('', 0))
            other = free.getsockname()[1]
        state = ('is in use (another distributed run?)' if exc.errno == errno.EADDRINUSE else
                 f'cannot be listened on ({exc.strerror})')
        sys.exit(f'error: port {port} {state}: choose a free one, e.g. PORT={other} bash '
                 f'tools/dist_train.sh {config} {nproc} ...')
PY
fi

# exec: a signal to this script reaches torchrun, which stops the training processes; they end
# with torchrun's pid, this one (mmdropit.common.process_exit.end_with_launcher)
PYTHONPATH="$TOOLS_DIR/..${PYTHONPATH:+:$PYTHONPATH}" MMDROPIT_LAUNCHER_PID=$$ \
exec "${LAUNCH[@]}" \
    --nnodes="$NNODES" \
    --node_rank="$NODE_RANK" \
    --master_addr="$MASTER_ADDR" \
    --nproc_per_node="$NPROC" \
    --master_port="$PORT" \
    "$TOOLS_DIR/train.py" "$CONFIG" --launcher pytorch "${@:3}"
