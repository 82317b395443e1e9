#!/usr/bin/env bash
# Issue 25 on the one-GPU machine, in about three minutes: builds for sm_90 what expert parallel needs and
# checks what one GPU can: the communicator's tests (the local backend's N ranks as threads; NCCL opened
# from the wheel nvidia-nccl-cu13 with a world of one on device memory), the CPU N-rank forward against
# one rank (bit for bit), `kdt generate --gpus 1 --backend cuda` against plain `kdt generate --backend cuda`
# (a world of one on the GPU gives today's output), --gpus 2 on one GPU refused clearly, the CPU ranks of
# `kdt generate --gpus 4`, and bench_comm's NCCL world of one. Logs in $OUT/logs (default /tmp/kdt-multi),
# the bench table in $OUT/bench_comm_1gpu.md; one summary line per step, last. scripts/gpu_multi_bench.sh
# is the run for a machine with several GPUs.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kdt-multi}
LOGS="$OUT/logs"
mkdir -p "$LOGS"
BUILD=${BUILD:-build}
DEADLINE=${DEADLINE:-230}
source scripts/gpu_notes.sh
same() {  # same NAME A B: PASS when the two logs' stdout lines (the ids or text) are equal and non-empty
    if [ -s "$LOGS/$2.out" ] && cmp -s "$LOGS/$2.out" "$LOGS/$3.out"; then note "PASS  $1: $(head -c 80 "$LOGS/$2.out" | tr '\n' ' ')"
    else note "FAIL  $1: '$(head -c 60 "$LOGS/$2.out" 2>/dev/null | tr '\n' ' ')' vs '$(head -c 60 "$LOGS/$3.out" 2>/dev/null | tr '\n' ' ')' ($(tail -1 "$LOGS/$3.log" | head -c 120))"; fi
}
gen() {  # gen NAME ARGS...: kdt generate, stdout to $LOGS/NAME.out, stderr to $LOGS/NAME.log
    local name=$1; shift
    timeout 60 "$BUILD/kdt" generate "$@" >"$LOGS/$name.out" 2>"$LOGS/$name.log"
}

MAKEVARS=(BUILD="$BUILD" CUDA_ARCH="-gencode arch=compute_90a,code=sm_90a")
source scripts/gpu_deps.sh  # libcjson, PCRE2, libmicrohttpd from .deb/ where missing
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$LOGS/info.log" 2>&1
NCCL=$(python3 -c 'import os, nvidia.nccl as n; print(os.path.join(list(n.__path__)[0], "lib", "libnccl.so.2"))' 2>/dev/null)
note "gpu: $(head -1 "$LOGS/info.log"); NCCL wheel: ${NCCL:-not installed (pip install -r python/requirements-gpu.txt)}"

T="$BUILD/tests"
step build 170 make -j16 "${MAKEVARS[@]}" "$BUILD/kdt" "$T/test_comm" "$T/test_model_ep" "$BUILD/bench/bench_comm" ||
    { tail -30 "$LOGS/build.log"; note "FAIL  build (see $LOGS/build.log)"; }

for t in test_comm test_model_ep; do
    [ -x "$T/$t" ] || { note "FAIL  $t: not built"; continue; }
    step "$t" 60 "$T/$t"
    grep -E '^(FAIL|SKIP) ' "$LOGS/$t.log" | head -10
    grep -E '^(PASS|SKIP)  nccl' "$LOGS/$t.log" | head -3
    note "$( [ "$(grep -c '^FAIL' "$LOGS/$t.log")" = 0 ] && [ "$(grep -c '^PASS' "$LOGS/$t.log")" -gt 0 ] && echo PASS || echo FAIL)  $t: $(counts "$LOGS/$t.log")"
done

# A world of one on the GPU: --gpus 1 is today's path, the output must be today's.
if [ -x "$BUILD/kdt" ]; then
    gen cuda_builtin --model builtin --backend cuda --prompt-ids 5,6,7,8 --prompt-ids 9,1,1 --max-new 32
    gen cuda_builtin_g1 --model builtin --backend cuda --prompt-ids 5,6,7,8 --prompt-ids 9,1,1 --max-new 32 --gpus 1
    same "cuda world of one, built-in batch of 2, 32 ids" cuda_builtin cuda_builtin_g1
    gen cuda_small --model models/kdt-small --backend cuda --prompt "def parse_args():" --max-new 48 --spec lookup
    gen cuda_small_g1 --model models/kdt-small --backend cuda --prompt "def parse_args():" --max-new 48 --spec lookup --gpus 1
    same "cuda world of one, kdt-small text, spec lookup" cuda_small cuda_small_g1
    gen cuda_g2 --model builtin --backend cuda --prompt-ids 1,2 --max-new 4 --gpus 2
    rc=$?
    if [ $rc = 1 ] && grep -q "asks for 2 CUDA devices" "$LOGS/cuda_g2.log"; then note "PASS  --gpus 2 on one GPU: exit 1, $(grep -o 'asks for.*' "$LOGS/cuda_g2.log" | head -c 90)"
    else note "FAIL  --gpus 2 on one GPU: exit $rc: $(tail -1 "$LOGS/cuda_g2.log")"; fi
    gen cpu_small --model models/kdt-small --backend cpu --prompt "def parse_args():" --max-new 24
    gen cpu_small_g4 --model models/kdt-small --backend cpu --prompt "def parse_args():" --max-new 24 --gpus 4
    same "cpu, kdt-small text, 4 ranks as threads = 1 rank" cpu_small cpu_small_g4
    KDT_TEST_FAIL_LOAD_RANK=2 gen cpu_fail --model builtin --backend cpu --prompt-ids 1,2 --max-new 4 --gpus 3 &&
        note "FAIL  injected load failure: exit 0" ||
        { grep -q "rank 2.*injected" "$LOGS/cpu_fail.log" && note "PASS  rank 2 of 3 fails to load: every rank ends, rank 0 names it" ||
          note "FAIL  injected load failure: $(tail -1 "$LOGS/cpu_fail.log")"; }
fi

# NCCL world of one: the library loads and every collective runs (timings are NCCL's local copies).
if [ -x "$BUILD/bench/bench_comm" ]; then
    step bench_comm 40 "$BUILD/bench/bench_comm" --gpus 1 --iters 20 --rows 1,64,1088 --out "$OUT/bench_comm_1gpu.md" &&
        note "PASS  bench_comm, NCCL world of one: $(grep -E '^\| 64 \| [0-9]' "$OUT/bench_comm_1gpu.md" | head -1)" ||
        { tail -3 "$LOGS/bench_comm.log"; note "FAIL  bench_comm: $(tail -1 "$LOGS/bench_comm.log")"; }
fi

echo
echo "== summary (logs in $LOGS, $((SECONDS)) s)"
printf '%s\n' "${summary[@]}"
