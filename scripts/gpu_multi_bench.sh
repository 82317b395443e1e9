#!/usr/bin/env bash
# Issue 25 on a machine with several GPUs (nvidia-h200-x2/x4/x8), ready for when one is lent: builds for
# sm_90, then (1) test_comm and test_model_ep (the local backend's ranks; every collective on NCCL worlds of 1 .. 4
# GPUs); (2)
# bench_comm over NCCL on 2, 4 and 8 GPUs (as many as there are): the communication of one decode step at
# Kimi K2's dims under each exchange design, per layer and per step, into $OUT/bench_comm_<N>gpu.md; (3)
# `kdt generate --gpus N --backend cuda`, which says the CUDA expert exchange is not built yet until it
# is (docs/multi_gpu.md), next to --gpus 1 on the same prompt. Logs in $OUT/logs (default
# /tmp/kdt-multi-bench); one summary line per step, last. About four minutes on 8 GPUs.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kdt-multi-bench}
LOGS="$OUT/logs"
mkdir -p "$LOGS"
BUILD=${BUILD:-build}
DEADLINE=${DEADLINE:-560}
source scripts/gpu_notes.sh

MAKEVARS=(BUILD="$BUILD" CUDA_ARCH="-gencode arch=compute_90a,code=sm_90a")
source scripts/gpu_deps.sh
NGPU=$(nvidia-smi -L 2>/dev/null | wc -l)
note "gpus: $NGPU x $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1)"
nvidia-smi topo -m >"$LOGS/topo.log" 2>&1

T="$BUILD/tests"
step build 240 make -j32 "${MAKEVARS[@]}" "$BUILD/kdt" "$T/test_comm" "$T/test_model_ep" "$BUILD/bench/bench_comm" ||
    tail -30 "$LOGS/build.log"
for t in test_comm test_model_ep; do
    [ -x "$T/$t" ] && step "$t" 60 "$T/$t" &&
        note "$t: $(grep -c '^PASS' "$LOGS/$t.log") passed, $(grep -c '^FAIL' "$LOGS/$t.log") failed"
done

for n in 2 4 8; do
    [ "$n" -le "$NGPU" ] || { note "bench_comm $n GPUs: SKIP, $NGPU GPUs here"; continue; }
    step "bench_comm_$n" 90 "$BUILD/bench/bench_comm" --gpus "$n" --out "$OUT/bench_comm_${n}gpu.md" &&
        sed -n '/exact (bcast/,$p' "$OUT/bench_comm_${n}gpu.md"
done

for n in 1 2 "$NGPU"; do
    [ "$n" -le "$NGPU" ] || continue
    timeout 60 "$BUILD/kdt" generate --model models/kdt-small --backend cuda --prompt "def parse_args():" --max-new 32 \
        --gpus "$n" >"$LOGS/gen_$n.out" 2>"$LOGS/gen_$n.log"
    note "generate --gpus $n cuda: exit $?: $(head -c 60 "$LOGS/gen_$n.out" | tr '\n' ' ') $(grep -o 'KDT_ERR_[A-Z_]*\|no expert exchange yet' "$LOGS/gen_$n.log" | head -2 | tr '\n' ' ')"
done

echo
echo "== summary (logs in $LOGS, $SECONDS s)"
printf '%s\n' "${summary[@]}"
