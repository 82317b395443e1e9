#!/usr/bin/env bash
# A CUPTI timeline (dev/trace/cupti_trace.c; nsys is not installed on our GPU machine) of the shipped
# model's steps at batch 1: plain greedy decoding and `--spec lookup`, this tree beside main (BASE_REF,
# built from `git archive`), each traced by the driver's injection hook; bench/trace_steps.py summarises
# every trace per step (period, GPU busy and idle, kernels, host API time, the median step's events in
# order) into $OUT/<name>.md (each run first untraced too: CUPTI's records slow the host's API calls) and slices three steps into $OUT/<name>_slice.json (Perfetto opens it).
# Prompt: held-out prompt 1 (the first line) of models/kdt-small; 128 new tokens; the first 8 forwards are
# left out of the medians. Bounded by DEADLINE seconds (default 100); one "PASS/FAIL/SKIP" line a step.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kdt-trace}
LOGS="$OUT/logs"
mkdir -p "$LOGS"
DEADLINE=${DEADLINE:-100}
BASE_REF=${BASE_REF:-main}
BASE=${BASE:-/tmp/kdt-trace-base}
MODEL=models/kdt-small
MAKEVARS=(BUILD=build CUDA_ARCH="-gencode arch=compute_90a,code=sm_90a")
source scripts/gpu_deps.sh
npass=0 nfail=0 nskip=0
source scripts/gpu_steps.sh  # say, step
: >"$OUT/summary.txt"
say "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1); this tree $(git rev-parse --short HEAD 2>/dev/null || echo '?'), base $BASE_REF $(git rev-parse --short "$BASE_REF" 2>/dev/null || echo '?')"

rm -rf "$BASE" && mkdir -p "$BASE"
git archive "$BASE_REF" 2>"$LOGS/base_src.log" | tar -x -C "$BASE" 2>>"$LOGS/base_src.log"
if [ -f "$BASE/Makefile" ]; then
    (cd "$BASE" && timeout 100 make -j8 "${MAKEVARS[@]}" build/kdt >"$LOGS/build_base.log" 2>&1) &
    base_pid=$!
fi
step build 100 make -j8 "${MAKEVARS[@]}" build/kdt build/dev/libkdt_trace.so || tail -5 "$LOGS/build.log"
[ -n "${base_pid:-}" ] && { wait "$base_pid" && say "PASS  build_base" || say "FAIL  build_base"; }

ids=$(sed -n "1p" "$MODEL/heldout_prompts.ids" | tr -s ' ' ',' | sed 's/,$//')
trace() { # trace NAME KDT [spec args]
    local name=$1 kdt=$2; shift 2
    [ -x "$kdt" ] || { say "SKIP  $name (no $kdt)"; return; }
    step "${name}_untraced" 30 "$kdt" generate --model "$MODEL" --backend cuda --prompt-ids "$ids" --max-new 128 "$@" &&
        grep -oE 'decode [0-9]+ tokens in [0-9.]+ s \([0-9.]+ tokens/s\)' "$LOGS/${name}_untraced.log" |
        sed "s/^/      ${name}_untraced: /" | tee -a "$OUT/summary.txt"
    CUDA_INJECTION64_PATH=$PWD/build/dev/libkdt_trace.so KDT_TRACE_OUT="$OUT/$name.json" \
        step "$name" 30 "$kdt" generate --model "$MODEL" --backend cuda --prompt-ids "$ids" --max-new 128 "$@" || return
    grep -oE 'decode [0-9]+ tokens in [0-9.]+ s \([0-9.]+ tokens/s\)' "$LOGS/$name.log" | sed "s/^/      $name: /" | tee -a "$OUT/summary.txt"
    python3 bench/trace_steps.py "$OUT/$name.json" --label "$name" --skip 8 --out "$OUT/$name.md" \
        --slice "$OUT/${name}_slice.json" >"$LOGS/${name}_summary.log" 2>&1 &&
        say "      $(sed -n 3p "$OUT/$name.md")" || say "FAIL  ${name}_summary: $(tail -2 "$LOGS/${name}_summary.log")"
    rm -f "$OUT/$name.json"  # the full trace is large; the slice and the summary stay
}
for v in new base; do
    kdt=build/kdt; [ $v = base ] && kdt=$BASE/build/kdt
    trace "plain_$v" "$kdt"
    trace "lookup_$v" "$kdt" --spec lookup --depth 16 --topk 1 --budget 16
done
say "gpu_trace: $npass passed, $nfail failed, $nskip skipped ($SECONDS s)"
