#!/usr/bin/env bash
# Issues 21 and 23, the small row kernels around the GEMMs (branch sk: kernels.cu's RMSNorm,
# moe_combine and kv_append, route.cu's routers), on a GPU machine in under 3 minutes. Builds (sm_90a)
# this tree and, beside it, $BASE_REV (default main; on a merged tree, the commit before the merge)
# from git, with this tree's bench_model*.cu so that only the library differs. Runs
# test_model_kernels (the kernels against the CPU); bench_model --only kimi (Kimi dims, 2 layers,
# bf16: prefill, decode and 16-row verify at B = 1, 8, 32) and bench_model_quant --only int4 --gb $GB
# (K2.6 layout, INT4 experts, 12 layers: decode at B = 1, 8, 32), this tree then the baseline; ncu's
# per-kernel list of one batch-1 decode step (graphs off, flags 9) of the 2-layer K2.6 INT4 model and
# of the Kimi-dims model; the model's CUDA tests (test_model_cuda, test_model_graph, test_quant_cuda,
# test_spec); then the baseline's ncu lists and a before/after table per kernel name. Every step is
# cut to what is left of $DEADLINE seconds; one "## " line per step, the summary last; logs in
# $OUT/logs, tables in $OUT. No network: see scripts/gpu_deps.sh.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kdt-small-kernels}
LOGS="$OUT/logs"
mkdir -p "$LOGS"
BUILD=${BUILD:-build}
DEADLINE=${DEADLINE:-174}
GB=${GB:-110}
BASE_REV=${BASE_REV:-main}
source scripts/gpu_notes.sh # note, step, counts, tests

MAKEVARS=(BUILD="$BUILD" CUDA_ARCH="-gencode arch=compute_90a,code=sm_90a")
source scripts/gpu_deps.sh
note "gpu: $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader 2>&1 | head -1)"

T="$BUILD/tests" BM="$BUILD/bench/bench_model" BQ="$BUILD/bench/bench_model_quant"
BASE=/tmp/kdt-small-kernels-base
rm -rf "$BASE" && mkdir -p "$BASE"
base_pid=
if git rev-parse -q --verify "$BASE_REV" >/dev/null 2>&1 && git archive "$BASE_REV" | tar -x -C "$BASE"; then
    note "baseline: $BASE_REV $(git rev-parse --short "$BASE_REV"); this tree: $(git rev-parse --short HEAD 2>/dev/null)"
    cp bench/bench_model.cu bench/bench_model_quant.cu bench/bench_common.h "$BASE/bench/"
    (cd "$BASE" && timeout 120 make -j16 "${MAKEVARS[@]}" "$BM" "$BQ" >"$LOGS/build_base.log" 2>&1) &
    base_pid=$!
else
    note "baseline: none ($BASE_REV not in git)"
fi
step build 120 make -j16 "${MAKEVARS[@]}" "$T/test_model_kernels" "$T/test_model_cuda" "$T/test_model_graph" "$T/test_quant_cuda" \
    "$T/test_spec" "$BM" "$BQ" || grep -E 'error' "$LOGS/build.log" | head -20
tests test_model_kernels 20
if [ -n "$base_pid" ]; then # the benchmarks run with no build beside them
    wait "$base_pid"
    note "build_base: exit $? ($LOGS/build_base.log)"
fi

# bench_model rows: | B | prefill tokens | prefill ms | tok/s | decode ms | tok/s | verify ms | rows/s | floor | x | floor | x |
bm() { # bm NAME BIN
    [ -x "$2" ] || { note "$1: FAIL (not built)"; return; }
    step "$1" 30 "$2" --only kimi --reps 3 --decode 16 --out "$OUT/$1.md"
    note "$1: $(awk -F'|' '/^\| +(1|8|32) \|/ { gsub(/ /, ""); printf "B=%s prefill %s ms, decode %s ms (%sx), verify %s ms (%sx); ", $2, $4, $6, $11, $8, $13 }' "$OUT/$1.md" 2>/dev/null)"
}
bm bench_model_new "$BM"
bm bench_model_main "$BASE/$BM"

bq() { # bq NAME BIN: bench_model_quant rows | B | ms | tok/s | floor GB | floor ms | x floor | ...
    [ -x "$2" ] || { note "$1: FAIL (not built)"; return; }
    step "$1" 35 "$2" --only int4 --gb "$GB" --decode 16 --out "$OUT/$1.md"
    note "$1: $(awk -F'|' '/^\| (1|8|32) \|/ { gsub(/ /, ""); printf "B=%s %s ms (%sx floor); ", $2, $3, $7 }' "$OUT/$1.md" 2>/dev/null)"
}
bq bmq_int4_new "$BQ"
bq bmq_int4_main "$BASE/$BQ"

# ncu: one batch-1 decode step, graphs off (flags 9: device MoE, fused), per kernel.
ncu_step() { # ncu_step NAME BIN ARGS...
    local name=$1 bin=$2; shift 2
    command -v ncu >/dev/null || { note "$name: skipped, no ncu"; return; }
    [ -x "$bin" ] || { note "$name: FAIL (not built)"; return; }
    KDT_MODEL_FLAGS=9 step "$name" 30 ncu --profile-from-start off --clock-control none --cache-control none --csv \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum "$bin" "$@"
    python3 scripts/ncu_kernels.py list "$LOGS/$name.log" "$OUT/$name.csv" "$name" >"$OUT/$name.txt" 2>&1
    while read -r l; do note "$l"; done <"$OUT/$name.txt"
}
ncu_diff() { # ncu_diff NAME: the table of $OUT/NAME_main.csv against $OUT/NAME_new.csv
    [ -s "$OUT/$1_main.csv" ] && [ -s "$OUT/$1_new.csv" ] || return
    python3 scripts/ncu_kernels.py diff "$OUT/$1_main.csv" "$OUT/$1_new.csv" >"$OUT/$1_diff.md" 2>&1
    note "$1: before / after per kernel in $OUT/$1_diff.md; $(tail -1 "$OUT/$1_diff.md")"
}
Q1=(--only int4 --gb 12 --decode 1 --batch 1)
K1=(--only kimi --batches 1 --decode 1 --reps 1 --prompt 16)
ncu_step ncu_k26_new "$BQ" "${Q1[@]}"
ncu_step ncu_kimi_new "$BM" "${K1[@]}"

tests test_model_cuda 25
tests test_model_graph 25
tests test_quant_cuda 30
tests test_spec 25

# The baseline's lists last (docs/perf/data has an older K2.6 one where time runs out).
ncu_step ncu_k26_main "$BASE/$BQ" "${Q1[@]}"
ncu_diff ncu_k26
ncu_step ncu_kimi_main "$BASE/$BM" "${K1[@]}"
ncu_diff ncu_kimi

echo
echo "== summary (logs in $LOGS, tables in $OUT)"
printf '%s\n' "${summary[@]}"
