#!/usr/bin/env bash
# Run on the GPU machine (device tool), from the repository root, with .gpu carried:
#
#   bash tools/gpu/on_device.sh OUT STAGE...        e.g. (two calls, back to back)
#   bash tools/gpu/on_device.sh $OUT setup mmcv-background kernel-tests mmcv-wait mmcv-save tests
#   bash tools/gpu/on_device.sh $OUT setup mmcv bench detect snapshot summary
#   bash tools/gpu/on_device.sh --dry-run OUT STAGE...   print the commands only
#
# Stages (each writes into OUT):
#   setup            install the carried wheels into /tmp/site (no registry there), record the
#                    machine (environment.txt); mmdropit runs from this checkout (PYTHONPATH)
#   mmcv             build mmcv 2.1.0 from .gpu/src with CUDA ops for this GPU only
#                    (TORCH_CUDA_ARCH_LIST from the GPU, MAX_JOBS = cores); if that fails, mmcv
#                    without ops, and mmcv.txt says which parts then cannot run
#   mmcv-background  the same in the background (setsid), to overlap other stages; the machine
#                    keeps it across calls while it stays warm (30 s idle)
#   mmcv-wait        wait for a background build (at most 8 minutes)
#   mmcv-lite        mmcv 2.1.0 without ops (seconds, not minutes: for a short lease); mmcv.txt
#                    says which parts then cannot run
#   mmcv-save        pack the built mmcv into OUT/mmcv-prebuilt.tgz.part-* (15 MB parts, within the
#                    device tool's file limits); carried back as .gpu/prebuilt/, a later machine
#                    unpacks them instead of building (the mmcv stages look there first)
#   cpu-kernels      build the fused CPU kernels (python -m mmdropit.kernels.cpu.build; ninja is
#                    carried): their library holds DropIT Linear's C++ autograd node, which runs
#                    on the GPU with the Triton kernels (cpu-kernels.log; cached on the machine)
#   host-cost        the host time a DropIT Linear and a DropIT 3x3 convolution add to a tiny
#                    host-bound step on the GPU: plain, mink and random as the C++ node, as the
#                    Python Function, eager (python -m mmdropit.bench.host_cost --device cuda;
#                    host_cost.md, host_cost_{linear,conv}.json)
#   kernel-tests     DropIT's and the codecs' Triton kernels against the eager path, compiled on
#                    CUDA tensors (needs no mmcv: runs beside a background build; kernel-tests.log)
#   tests            pytest -m cuda over the test files that hold CUDA tests (needs mmcv;
#                    tests.log), the eager DropIT path's sync check included
#   kernels          DropIT's kernels (keep_topk at gamma 0.9 fused and eager, keep_random,
#                    scatter_bitmask, the codec kernels) on DeiT-S and ResNet-50 layer inputs at
#                    batch 64 and 256, bf16 and fp32: GB/s beside the copy's, time beside the layer's
#                    GEMM, then keep_topk and scatter_bitmask launch by launch on the DeiT-S
#                    inputs at batch 256 (python -m mmdropit.bench.kernel_speed; needs no mmcv;
#                    kernels/)
#   bench            DeiT-S and ResNet-50, batch 64: baseline, per-block checkpointing, DropIT
#                    (Triton kernels and eager path, exact and sampled threshold, fp32 and bf16),
#                    least-memory plan, plan at 0.5, 4 micro-batches, bf16 and fp16 autocast,
#                    MemoryBudgetHook at 0.5 (bench-<model>/)
#   bench-MODEL      the same for one model (bench-deit_small, bench-resnet50)
#   compiled         DeiT-S, batch 64, compiled and replayed as CUDA graphs (--compile
#                    reduce-overhead): bf16 autocast beside DropIT in bf16, where no launch
#                    costs host time (compiled/; needs no mmcv: runs beside its build)
#   detect           Faster R-CNN R50-FPN, batch 2 at 1333x800, the same variants (needs mmcv's
#                    ops; detect/)
#   ogc              our plans on the OGC paper's 18 models at its own batch sizes (--ogc-table
#                    --ogc-scale 1), where its GPU figures compare directly (ogc/)
#   frontier         the frontier (--frontier): DeiT-S at batch 256 and ResNet-50 at batch 128,
#                    one process each, bf16 autocast as the model's precision (what an
#                    AmpOptimWrapper would run): the simple recipe (bf16, per-block
#                    checkpointing, 2 micro-batches, torch.compile) beside our plans (and
#                    our per-block plan with the blocks' inputs in host memory), the budget
#                    at 0.5 / 0.25 / least, with offload too, each point dominated or not
#                    (FRONTIER_VARIANTS, FRONTIER_STEPS timed rounds; frontier-<model>/)
#   frontier-MODEL   the same for one model (frontier-deit_small, frontier-resnet50)
#   snapshot         CUDA memory snapshots of a DeiT-S baseline step and a planned one (HTML)
#   summary          a short table of every benchmark.json under OUT, then the kernel table and
#                    the host-cost tables when those stages ran, printed last
# A stage may end in @SECONDS (kernel-tests@90): its command is stopped after that long, and the
# stages after it still run (a short lease cannot lose them all to one that hangs); pytest is
# interrupted 20 s before (SIGINT), so that a stopped test stage still reports its failures.
# Each stage's start and end go to OUT/stages.log.
set -uo pipefail
DRY=0
if [[ "${1:-}" == "--dry-run" ]]; then DRY=1; shift; fi
if [[ $# -lt 2 ]]; then
  echo "usage: bash tools/gpu/on_device.sh [--dry-run] OUT STAGE... (stages: setup mmcv" \
       "mmcv-background mmcv-wait mmcv-save mmcv-lite cpu-kernels host-cost kernel-tests" \
       "tests kernels bench" \
       "bench-MODEL compiled detect ogc frontier frontier-MODEL snapshot summary, each" \
       "optionally @SECONDS)" >&2
  exit 2
fi
OUT=$1; shift
STAGES=("$@")
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)"
SITE=/tmp/site
MMCV_SITE=/tmp/site-mmcv
BUILD_LOG=/tmp/mmcv-build.log
PY=${PYTHON:-python3}
STEPS=${STEPS:-10}  # timed rounds per benchmark (a GPU step is short: more rounds, less noise)
export PYTHONPATH="$ROOT:$SITE:$MMCV_SITE${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
export PATH="$SITE/bin:$PATH"  # the carried ninja
export PIP_CONFIG_FILE=/dev/null PIP_NO_INDEX=1 PIP_DISABLE_PIP_VERSION_CHECK=1
COMPILED_VARIANTS=${COMPILED_VARIANTS:-bf16-autocast,dropit-mink+bf16}  # inductor: ~2 compiles each
FRONTIER_STEPS=${FRONTIER_STEPS:-5}  # the frontier's searches and compile take the stage's time
# the frontier on a GPU, in bf16 (the fp32 plain step runs too: the peaks' reference)
FRONTIER_VARIANTS=${FRONTIER_VARIANTS:-bf16-autocast,grad-ckpt+bf16,micro-2+bf16,grad-ckpt+micro-2+bf16,dropit-mink+bf16,compile+bf16,ckpt-plan-0.5+bf16,ckpt-plan-min+bf16,budget-0.5+bf16,budget-0.5-rebuilt+bf16,budget-0.25+bf16,budget-least+bf16,offload-0.5+bf16,int8-acts+bf16,ckpt-per-block+bf16,ckpt-per-block-host+bf16,ckpt-plan-min-host+bf16,budget-0.25-offload+bf16,budget-least-offload+bf16}
VARIANTS=${VARIANTS:-grad-ckpt,dropit-mink,dropit-mink-eager,dropit-approx,dropit-approx-eager,dropit-mink+bf16,dropit-mink-eager+bf16,ckpt-plan-min,ckpt-plan-0.5,micro-4,bf16-autocast,fp16-autocast,budget-0.5,budget-0.5-offload,offload-0.5,save-on-cpu-0.5,grad-ckpt+bf16,ckpt-plan-min+bf16,ckpt-plan-0.5+bf16,offload-0.5+bf16,budget-0.5+bf16,budget-0.5-offload+bf16}

BENCH_MODELS=(deit_small resnet50)
declare -A FRONTIER_BATCH=([deit_small]=256 [resnet50]=128)
for stage in "${STAGES[@]}"; do
  name=${stage%@*}
  if [[ $stage == *@* && ! ${stage##*@} =~ ^[0-9]+$ ]]; then
    echo "error: stage '$stage': the limit after @ must be whole seconds" >&2; exit 2
  fi
  case $name in
    setup|mmcv|mmcv-background|mmcv-wait|mmcv-save|mmcv-lite|cpu-kernels|host-cost) ;;
    kernel-tests|tests|kernels|bench|compiled|detect|ogc|frontier|snapshot|summary) ;;
    bench-*) [[ " ${BENCH_MODELS[*]} " == *" ${name#bench-} "* ]] ||
               { echo "error: unknown stage '$name'" >&2; exit 2; } ;;
    frontier-*) [[ -n "${FRONTIER_BATCH[${name#frontier-}]:-}" ]] ||
               { echo "error: unknown stage '$name'" >&2; exit 2; } ;;
    *) echo "error: unknown stage '$name'" >&2; exit 2 ;;
  esac
done
LIMIT=()  # the current stage's `timeout SECONDS`, when it has one
XDIST=  # 1 where pytest-xdist is there (the GPU image has it): the pytest stages use workers
if (( DRY )) || $PY -c 'import xdist' 2> /dev/null; then XDIST=1; fi

pytest_limit() {  # the stage's limit for pytest: SIGINT 20 s early (pytest-xdist waits up to
  # 10 s for its workers before pytest prints its failures), killed at the stage's own limit
  (( ${#LIMIT[@]} )) || return 0
  local limit=$(( 10#${LIMIT[1]} )) grace
  grace=$(( limit > 40 ? 20 : limit / 2 ))
  LIMIT=(timeout -s INT -k "$grace" "$(( limit - grace ))")
}

run() {  # run (or print) a command, its output also in OUT/<log>
  local log=$1; shift
  if (( DRY )); then echo "${LIMIT[*]}${LIMIT:+ }$*  > $OUT/$log"; return 0; fi
  echo "[on_device] $(date +%T) ${LIMIT[*]}${LIMIT:+ }$*"
  "${LIMIT[@]}" "$@" 2>&1 | tee -a "$OUT/$log"
  return "${PIPESTATUS[0]}"
}

install_mmcv_without_ops() {  # $1: why (mmcv.txt says it)
  rm -rf "$MMCV_SITE"  # pip --target leaves an existing mmcv in place
  MMCV_WITH_OPS=0 $PY -m pip install -q --no-build-isolation --no-deps --target "$MMCV_SITE" \
    "$ROOT"/.gpu/src/mmcv-2.1.0.tar.gz
  echo "mmcv 2.1.0 WITHOUT ops ($1): the detector rows (nms, RoIAlign) and the tests that" \
       "need mmcv.ops cannot run" > "$OUT/mmcv.txt"
}

build_mmcv() {
  local arch
  rm -rf "$MMCV_SITE"  # pip --target leaves an existing mmcv in place: a lite one would stay
  if compgen -G "$ROOT/.gpu/prebuilt/mmcv-prebuilt.tgz.part-*" > /dev/null; then
    mkdir -p "$MMCV_SITE"
    cat "$ROOT"/.gpu/prebuilt/mmcv-prebuilt.tgz.part-* | tar xz -C "$MMCV_SITE" &&
      echo "mmcv 2.1.0 unpacked from .gpu/prebuilt (built on an earlier machine)" > "$OUT/mmcv.txt" &&
      return 0
  fi
  arch=$($PY -c 'import torch; print("%d.%d" % torch.cuda.get_device_capability())')
  if MMCV_WITH_OPS=1 FORCE_CUDA=1 TORCH_CUDA_ARCH_LIST="$arch" MAX_JOBS="$(nproc)" \
     $PY -m pip install -q --no-build-isolation --no-deps --target "$MMCV_SITE" \
       "$ROOT"/.gpu/src/mmcv-2.1.0.tar.gz; then
    echo "mmcv 2.1.0 built with CUDA ops for sm_${arch/./}" > "$OUT/mmcv.txt"
  else
    install_mmcv_without_ops "the CUDA build failed, see mmcv-build.log"
  fi
}

bench() {  # one model's benchmark, in a process of its own
  run bench.log $PY "$ROOT/tools/benchmark.py" --device cuda --models "$1" \
    --batch-size 64 --steps "$STEPS" --variants "$VARIANTS" --out "$OUT/bench-$1"
}

frontier() {  # one model's frontier, in a process of its own
  run frontier.log $PY "$ROOT/tools/benchmark.py" --device cuda --frontier --models "$1" \
    --batch-size "${FRONTIER_BATCH[$1]}" --steps "$FRONTIER_STEPS" \
    --variants "$FRONTIER_VARIANTS" --out "$OUT/frontier-$1"
}

(( DRY )) || mkdir -p "$OUT"
for stage in "${STAGES[@]}"; do
  LIMIT=()
  [[ $stage == *@* ]] && LIMIT=(timeout "${stage##*@}")
  (( DRY )) || echo "$(date +%T) start $stage" >> "$OUT/stages.log"
  case ${stage%@*} in
    setup)
      run setup.log $PY -m pip install -q --no-deps --no-compile --upgrade --target "$SITE" \
        "$ROOT"/.gpu/wheels/*.whl
      (( DRY )) || { nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv
                     $PY -c 'import torch, timm, mmengine; print("torch", torch.__version__,
                        "cuda", torch.version.cuda, "timm", timm.__version__, "mmengine",
                        mmengine.__version__)'; } > "$OUT/environment.txt" 2>&1 ;;
    mmcv)
      if (( DRY )); then echo "build mmcv (CUDA ops) into $MMCV_SITE  > $BUILD_LOG"
      else build_mmcv > "$BUILD_LOG" 2>&1; cp "$BUILD_LOG" "$OUT/mmcv-build.log"; fi ;;
    mmcv-background)
      if (( DRY )); then echo "setsid: build mmcv (CUDA ops) into $MMCV_SITE  > $BUILD_LOG"
      else
        export -f build_mmcv install_mmcv_without_ops; export OUT ROOT MMCV_SITE PY
        setsid nohup bash -c 'build_mmcv; touch /tmp/mmcv-build.done' > "$BUILD_LOG" 2>&1 &
      fi ;;
    mmcv-wait)
      if (( ! DRY )); then
        for _ in $(seq 480); do [[ -f /tmp/mmcv-build.done ]] && break; sleep 1; done
        cp "$BUILD_LOG" "$OUT/mmcv-build.log" 2>/dev/null
        [[ -f /tmp/mmcv-build.done ]] || echo "mmcv build not finished after 8 minutes" \
          > "$OUT/mmcv.txt"
      fi ;;
    mmcv-save)
      if (( DRY )); then echo "tar $MMCV_SITE | split  > $OUT/mmcv-prebuilt.tgz.part-*"
      else tar cz -C "$MMCV_SITE" . | split -b 15M -d - "$OUT/mmcv-prebuilt.tgz.part-"; fi ;;
    cpu-kernels)
      run cpu-kernels.log $PY -m mmdropit.kernels.cpu.build ;;
    host-cost)
      for layer in linear conv; do
        run host_cost.md $PY -m mmdropit.bench.host_cost --device cuda --strategies mink random \
          --rounds 5 --layer $layer --json "$OUT/host_cost_$layer.json"
      done ;;
    kernel-tests)  # hundreds of Triton compiles: spread over workers
      pytest_limit
      run kernel-tests.log $PY -m pytest -q -rfE --durations=10 ${XDIST:+-n 8} \
        -p no:cacheprovider "$ROOT/tests/kernels/test_triton_kernels.py" \
        "$ROOT/tests/kernels/test_triton_codec_kernels.py" ;;
    tests)  # -v: each test's outcome as it ends; fewer workers, a file's tests in one
      pytest_limit
      run tests.log $PY -m pytest -v -rfE --tb=short --durations=10 \
        ${XDIST:+-n 4 --dist loadfile} -m cuda -p no:cacheprovider "$ROOT/tests/cuda" \
        "$ROOT/tests/kernels" "$ROOT/tests/dropit/test_no_host_sync.py" \
        "$ROOT/tests/dropit/test_nodes.py" "$ROOT/tests/memory/test_peak.py" \
        "$ROOT/tests/engine/test_memory_report_hook.py" ;;
    kernels)  # writes its table after each layer: a stage stopped by its limit keeps those
      run kernels.log $PY -m mmdropit.bench.kernel_speed "$OUT/kernels" --device cuda ;;
    bench)  # one process per model: a model that runs out of time still leaves the one before
      for model in "${BENCH_MODELS[@]}"; do bench "$model"; done ;;
    bench-*) name=${stage%@*}; bench "${name#bench-}" ;;
    frontier)  # one process per model, as bench
      for model in "${BENCH_MODELS[@]}"; do frontier "$model"; done ;;
    frontier-*) name=${stage%@*}; frontier "${name#frontier-}" ;;
    compiled)
      # perf_hints: inductor says so when it skips CUDA graphs for a graph (and why)
      run compiled.log env TORCH_LOGS=perf_hints $PY "$ROOT/tools/benchmark.py" --device cuda \
        --models deit_small --batch-size 64 --steps "$STEPS" --compile reduce-overhead \
        --variants "$COMPILED_VARIANTS" --out "$OUT/compiled" ;;
    mmcv-lite)
      if (( DRY )); then echo "build mmcv (no ops) into $MMCV_SITE  > $OUT/mmcv.txt"
      else
        install_mmcv_without_ops "stage mmcv-lite, chosen for a short lease" > "$BUILD_LOG" 2>&1
        cp "$BUILD_LOG" "$OUT/mmcv-build.log"
      fi ;;
    detect)
      run detect.log $PY "$ROOT/tools/benchmark.py" --device cuda --models faster_rcnn \
        --det-batch-size 2 --det-image-size 1333x800 --steps "$STEPS" \
        --variants "$VARIANTS" --out "$OUT/detect" ;;
    ogc)
      run ogc.log $PY "$ROOT/tools/benchmark.py" --device cuda --ogc-table --ogc-scale 1 \
        --steps "$STEPS" --out "$OUT/ogc" ;;
    snapshot)
      run snapshot.log $PY "$ROOT/tools/gpu/memory_snapshot.py" --model deit_small \
        --batch-size 64 --variants baseline,ckpt-plan-min --out "$OUT" ;;
    summary)
      run summary.log $PY "$ROOT/tools/gpu/summary.py" "$OUT"
      if [[ -f "$OUT/kernels/kernel_speed.md" ]]; then
        run summary.log cat "$OUT/kernels/kernel_speed.md"
      fi
      if [[ -f "$OUT/host_cost.md" ]]; then run summary.log cat "$OUT/host_cost.md"; fi ;;
  esac
  (( DRY )) || echo "$(date +%T) end $stage" >> "$OUT/stages.log"
done
