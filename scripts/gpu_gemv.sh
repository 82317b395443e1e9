#!/usr/bin/env bash
# Issues 21 and 23 (branch gv): the forward's bf16 projections on the weight-streaming kernel (kdt_sgemm) with
# programmatic dependent launch (its first weight loads before griddepcontrol.wait) and the dense / shared
# MLPs' gate/up fused with SiLU.mul (KDT_SGEMM_GLU), on the GPU machine in under 150 s (DEADLINE). Builds
# (sm_90a) this tree's test_quant_gemm, bench_quant_gemm, bench_model, bench_model_quant and the model's CUDA
# tests, and beside it main's bench_model and bench_model_quant from `git archive` ($BASE_BUILD/bench/... where
# set and present). Steps, each cut to what is left of DEADLINE:
#   test_quant_gemm: kdt_sgemm against the CPU (every format and cfg, PDL, GLU, M = 1 .. 32, bits M to M);
#   gemv: bench_quant_gemm --gemv, Kimi's bf16 projection shapes at M = 1, 4, 16: cuBLAS against kdt_sgemm
#     (each bf16 cfg with PDL, the picked one without, GLU) and the copy ceiling of the same run;
#   split: dev/cuda/gemv_split_bench, the same shapes with every K split S and bf16 cfg (PDL): the library's
#     pick against the fastest;
#   bench_model --only kimi --batches 1,8 (decode and 16-row verify against the floor): this tree (bf16 on
#     cuBLAS), this tree with every bf16 product of <= 16 rows on kdt_sgemm (KDT_LIN_SGEMM_BF16_MB=1000000), main;
#   bench_model_quant --only int4 --gb 110 --decode 16 --batch 1 (K2.6 layout): this tree, main;
#   the model's CUDA tests (test_model_cuda, test_model_graph, test_quant_cuda);
#   ncu per kernel of one batch-1 Kimi-dims decode step (graphs off): this tree with the bf16 products on
#     kdt_sgemm, main.
# One "## " line a step (PASS / FAIL and its figures), the summary last; logs in $OUT/logs, tables in $OUT.
#   OUT=/tmp/out bash scripts/gpu_gemv.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kdt-gemv}
LOGS="$OUT/logs"
mkdir -p "$LOGS"
BUILD=${BUILD:-build}
DEADLINE=${DEADLINE:-145}
source scripts/gpu_notes.sh # note, step, counts, tests

MAKEVARS=(BUILD="$BUILD" CUDA_ARCH="-gencode arch=compute_90a,code=sm_90a")
source scripts/gpu_deps.sh
note "gpu: $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader 2>&1 | head -1); this tree $(git rev-parse --short HEAD 2>/dev/null)"

T="$BUILD/tests" BQG="$BUILD/bench/bench_quant_gemm" BM="$BUILD/bench/bench_model" BQ="$BUILD/bench/bench_model_quant"
BASE=/tmp/kdt-gemv-base
base_pid=
if [ -n "${BASE_BUILD:-}" ] && [ -x "$BASE_BUILD/bench/bench_model" ]; then
    BBM="$BASE_BUILD/bench/bench_model" BBQ="$BASE_BUILD/bench/bench_model_quant"
    note "baseline: \$BASE_BUILD ($BASE_BUILD)"
else
    BBM="$BASE/$BM" BBQ="$BASE/$BQ"
    rm -rf "$BASE" && mkdir -p "$BASE"
    if git archive main | tar -x -C "$BASE"; then
        note "baseline: main $(git rev-parse --short main)"
        (cd "$BASE" && timeout 110 make -j8 "${MAKEVARS[@]}" "$BM" "$BQ" >"$LOGS/build_main.log" 2>&1) &
        base_pid=$!
    else note "baseline: none (no main in git)"; fi
fi
step build 110 make -j16 "${MAKEVARS[@]}" "$T/test_quant_gemm" "$T/test_model_cuda" "$T/test_model_graph" "$T/test_quant_cuda" \
    "$BQG" "$BM" "$BQ" "$BUILD/dev/gemv_split_bench" || grep -E 'error' "$LOGS/build.log" | head -20

tests test_quant_gemm 20
grep -E 'sgemm (glu|bf16 M 16)' "$LOGS/test_quant_gemm.log" | head -4

if [ -x "$BQG" ]; then
    step gemv 25 "$BQG" --gemv --out "$OUT/gemv.md"
    grep -E '^- copy' "$OUT/gemv.md" 2>/dev/null | while read -r l; do note "gemv: $l"; done
    grep -E '^gemv ' "$LOGS/gemv.log" | while read -r l; do note "$l"; done
else note "gemv: FAIL (not built)"; fi

if [ -x "$BUILD/dev/gemv_split_bench" ]; then
    step split 25 "$BUILD/dev/gemv_split_bench" --out "$OUT/split.md"
    grep -E '^split ' "$LOGS/split.log" | while read -r l; do note "$l"; done
else note "split: FAIL (not built)"; fi

if [ -n "$base_pid" ]; then # the timings run with no build beside them
    wait "$base_pid"
    note "build_main: exit $? ($LOGS/build_main.log)"
fi

# bench_model rows: | B | prefill tokens | prefill ms | tok/s | decode ms | tok/s | verify ms | rows/s | floor | x | floor | x |
# and, where bench_model has them, the same floors at the copy bandwidth it measures: | floor | x | floor | x |
bm() { # bm NAME BIN [VAR=VALUE]: its decode and verify rows at B = 1, 8
    [ -x "$2" ] || { note "$1: FAIL (not built)"; return; }
    step "$1" 25 env ${3:-KDT_GV_DEFAULT=1} "$2" --only kimi --batches 1,8 --reps 3 --decode 16 --out "$OUT/$1.md"
    note "$1: $(awk -F'|' '/^\| +(1|8) \|/ { gsub(/ /, ""); printf "B=%s decode %s ms (%sx floor%s), verify %s ms (%sx%s); ", $2, $6, $11, $15 == "" ? "" : ", " $15 "x copy floor", $8, $13, $17 == "" ? "" : ", " $17 "x copy" }' "$OUT/$1.md" 2>/dev/null)"
}
bm bench_model_new "$BM"
bm bench_model_sgemm "$BM" KDT_LIN_SGEMM_BF16_MB=1000000
bm bench_model_main "$BBM"

bq() { # bq NAME BIN: bench_model_quant rows | B | ms | tok/s | floor GB | floor ms | x floor | ...
    [ -x "$2" ] || { note "$1: FAIL (not built)"; return; }
    step "$1" 25 "$2" --only int4 --gb 110 --decode 16 --batch 1 --out "$OUT/$1.md"
    note "$1: $(awk -F'|' '/^\| 1 \|/ { gsub(/ /, ""); printf "B=%s %s ms (%sx floor); ", $2, $3, $7 }' "$OUT/$1.md" 2>/dev/null)"
}
bq bmq_int4_new "$BQ"
bq bmq_int4_main "$BBQ"

tests test_model_cuda 20
tests test_model_graph 15
tests test_quant_cuda 15

# ncu: one batch-1 decode step, graphs off (flags 9: device MoE, fused), per kernel.
ncu_step() { # ncu_step NAME BIN [VAR=VALUE]
    command -v ncu >/dev/null || { note "$1: skipped, no ncu"; return; }
    [ -x "$2" ] || { note "$1: FAIL (not built)"; return; }
    KDT_MODEL_FLAGS=9 step "$1" 15 env ${3:-KDT_GV_DEFAULT=1} ncu --profile-from-start off --clock-control none --cache-control none --csv \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum "$2" --only kimi --batches 1 --decode 1 --reps 1 --prompt 16
    python3 scripts/ncu_kernels.py list "$LOGS/$1.log" "$OUT/$1.csv" "$1" >"$OUT/$1.txt" 2>&1
    head -12 "$OUT/$1.txt" | while read -r l; do note "$l"; done
}
ncu_step ncu_kimi_new "$BM" KDT_LIN_SGEMM_BF16_MB=1000000
ncu_step ncu_kimi_main "$BBM"
if [ -s "$OUT/ncu_kimi_main.csv" ] && [ -s "$OUT/ncu_kimi_new.csv" ]; then
    python3 scripts/ncu_kernels.py diff "$OUT/ncu_kimi_main.csv" "$OUT/ncu_kimi_new.csv" >"$OUT/ncu_kimi_diff.md" 2>&1
    note "ncu_kimi: before / after per kernel in $OUT/ncu_kimi_diff.md; $(tail -1 "$OUT/ncu_kimi_diff.md")"
fi

echo
echo "== summary in $SECONDS s (logs in $LOGS, tables in $OUT)"
printf '%s\n' "${summary[@]}"
