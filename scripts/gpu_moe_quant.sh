#!/usr/bin/env bash
# Issue 23, the grouped quantized-expert kernels (src/model/cuda/moe_quant.cu) and the packed INT4 layout
# of the routed experts (moe_quant.h), on a GPU machine in under 140 s: builds (sm_90a) only what it runs,
# and main's bench_model_quant beside it ($BASE_BUILD/bench/bench_model_quant where that exists, else main
# from git, that one binary); runs test_moe_quant (the kernels and the packing against the CPU);
# dev/cuda/moe_quant_bench (one layer's routed experts at R = 1, 8, 32: main's kernel, the library's on the
# checkpoint's layout and on the packed one, variants, against the copy ceiling of the same run);
# bench_model_quant (K2.6 layout, INT4 experts, 12 layers) at batch 1, 8, 32 for both builds; ncu on the
# packed kernels at R = 1; test_quant_cuda (FP8 and K2.6-INT4 fixtures through the forward) and
# test_quant_gemm (quant_mma.cuh's other user); then, if time is left, ncu's per-kernel time of one batch-1
# decode step. Logs in $OUT/logs, tables in $OUT; one "## " line per step, the summary last. No network:
# see scripts/gpu_deps.sh.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kdt-moe-quant}
LOGS="$OUT/logs"
mkdir -p "$LOGS"
BUILD=${BUILD:-build}
DEADLINE=${DEADLINE:-132}  # SCRIPT_BUDGET 140 s
GB=${GB:-110}              # bench_model_quant --gb, K2.6 INT4: 12 layers (dense + 11 MoE)
source scripts/gpu_notes.sh  # note, step

MAKEVARS=(BUILD="$BUILD" CUDA_ARCH="-gencode arch=compute_90a,code=sm_90a")
source scripts/gpu_deps.sh
note "gpu: $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader 2>&1 | head -1)"

# The baseline: main's library under this tree's bench_model_quant.cu (with $BASE_BUILD, main's bench: its
# floor columns are main's).
T="$BUILD/tests" B="$BUILD/bench/bench_model_quant"
BASE=/tmp/kdt-moe-quant-base
base_pid=
if [ -n "${BASE_BUILD:-}" ] && [ -x "$BASE_BUILD/bench/bench_model_quant" ]; then
    BB="$BASE_BUILD/bench/bench_model_quant"
    note "baseline: \$BASE_BUILD ($BB)"
else
    BB="$BASE/$BUILD/bench/bench_model_quant"
    rm -rf "$BASE" && mkdir -p "$BASE"
    if git rev-parse -q --verify main >/dev/null 2>&1 && git archive main | tar -x -C "$BASE"; then
        cp bench/bench_model_quant.cu bench/bench_common.h "$BASE/bench/"  # this tree's floor
        note "baseline: main $(git rev-parse --short main) with this tree's bench_model_quant.cu, built here"
        (cd "$BASE" && timeout 80 make -j8 "${MAKEVARS[@]}" "$BUILD/bench/bench_model_quant" >"$LOGS/build_base.log" 2>&1) &
        base_pid=$!
    else note "baseline: none (no main in git)"; fi
fi
step build 85 make -j16 "${MAKEVARS[@]}" "$T/test_moe_quant" "$T/test_quant_cuda" "$T/test_quant_gemm" "$B" "$BUILD/dev/moe_quant_bench" ||
    grep -E 'error' "$LOGS/build.log" | head -20
if [ -n "$base_pid" ]; then wait "$base_pid"; note "build_base: exit $? ($LOGS/build_base.log)"; fi

tests() { # tests NAME LIMIT: runs $T/NAME, notes its PASS / FAIL / SKIP counts
    [ -x "$T/$1" ] || { note "$1: FAIL (not built)"; return; }
    step "$1" "$2" "$T/$1"
    local rc=$? p f s
    p=$(grep -c '^PASS' "$LOGS/$1.log"); f=$(grep -c '^FAIL' "$LOGS/$1.log"); s=$(grep -c '^SKIP' "$LOGS/$1.log")
    grep -E '^FAIL ' "$LOGS/$1.log" | head -10
    note "$1: $([ "$rc" = 0 ] && [ "$f" = 0 ] && [ "$p" -gt 0 ] && echo PASS || echo FAIL) ($p passed, $f failed, $s skipped, exit $rc)"
}
tests test_moe_quant 30

# One MoE layer's routed experts (dev/cuda/moe_quant_bench.cu): main's kernel, the library's, variants.
if [ -x "$BUILD/dev/moe_quant_bench" ]; then
    step moe_quant_bench 30 "$BUILD/dev/moe_quant_bench" --out "$OUT/moe_quant_bench.md" --reps 16
    awk -F'|' '/^\| (int4|fp8) \|/ { gsub(/^ +| +$/, "", $4); printf "%s R=%s %s: %s us (gate/up %s, down %s), %s of copy, ye vs main %s\n", $2, $3, $4, $7, $5, $6, $12, $13 }' \
        "$OUT/moe_quant_bench.md" | tr -s ' ' >"$OUT/moe_quant_bench.txt"
    grep -m1 'copy ceiling' "$OUT/moe_quant_bench.md" | while read -r l; do note "moe_quant_bench: $l"; done
    while read -r l; do note "$l"; done <"$OUT/moe_quant_bench.txt"
else note "moe_quant_bench: FAIL (not built)"; fi

bench() { # bench NAME BIN ARGS...: bench_model_quant's rows "| B | ms | tok/s | floor GB | floor ms | x floor |..."
    local name=$1 bin=$2; shift 2
    [ -x "$bin" ] || { note "$name: FAIL (not built)"; return; }
    step "$name" 30 "$bin" --out "$OUT/$name.md" "$@"
    note "$name: $(awk -F'|' '/^\| (1|8|32) \|/ { gsub(/ /, ""); printf "B=%s %s ms (%sx floor, %s experts a layer; %sx uniform routing); ", $2, $3, $7, $10, $12 }' "$OUT/$name.md" 2>/dev/null)"
}
bench bmq_int4_new "$B" --only int4 --gb "$GB" --decode 16
bench bmq_int4_base "$BB" --only int4 --gb "$GB" --decode 16

# ncu on the grouped kernels at R = 1 (the dev bench's K2.6 INT4 calls; --reps 1: a variant is 4 calls of
# 2 launches, so "lib" is launches 0-7, "lib, packed" 8-15).
ncu_moe() { # ncu_moe NAME SKIP
    command -v ncu >/dev/null && [ -x "$BUILD/dev/moe_quant_bench" ] || return
    step "$1" 20 ncu --clock-control none --cache-control none -k regex:moe_quant_kernel --launch-skip "$2" -c 2 --section Occupancy \
        --section SchedulerStats --section WarpStateStats --section MemoryWorkloadAnalysis --metrics dram__bytes_read.sum,smsp__inst_executed.sum \
        "$BUILD/dev/moe_quant_bench" --only int4 --reps 1
    grep -E 'moe_quant_kernel|Achieved Occupancy|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Memory Throughput|Registers Per|dram__bytes_read|inst_executed' \
        "$LOGS/$1.log" | grep -v '==PROF==' | sed -E 's/ +/ /g; s/\(const __nv_bfloat16.*//' | cut -c1-150 >"$OUT/$1.txt"
    while read -r l; do note "$1: $l"; done <"$OUT/$1.txt"
}
ncu_moe ncu_moe_packed 8

tests test_quant_cuda 30
tests test_quant_gemm 25  # quant_gemm and kdt_sgemm on quant_mma.cuh's int4 step

# ncu: one batch-1 decode step (graphs off; the bench profiles its timed steps alone), per kernel.
ncu_step() { # ncu_step NAME BIN
    command -v ncu >/dev/null || { note "$1: skipped, no ncu"; return; }
    [ -x "$2" ] || { note "$1: FAIL (not built)"; return; }
    KDT_MODEL_FLAGS=9 step "$1" 20 ncu --profile-from-start off --clock-control none --cache-control none --csv \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum "$2" --only int4 --gb 12 --decode 1 --batch 1
    python3 scripts/ncu_kernels.py list "$LOGS/$1.log" "$OUT/$1.csv" "$1" 2>&1 | head -1 >"$OUT/$1.txt"
    awk -F, '/moe_quant_kernel/ { n++; us += $(NF-1); mb += $NF } END { printf "'"$1"': routed experts (moe_quant_kernel): %d launches, %.1f us, %.0f MB read\n", n, us, mb }' \
        "$OUT/$1.csv" >>"$OUT/$1.txt" 2>/dev/null
    while read -r l; do note "$l"; done <"$OUT/$1.txt"
}
ncu_step ncu_step_new "$B"

echo
echo "== summary (logs in $LOGS, tables in $OUT)"
printf '%s\n' "${summary[@]}"
