#!/usr/bin/env bash
# Acceptance and speed of the drafters on the shipped model, on the GPU machine in one
# call (about 6 minutes):
#   bash scripts/gpu_drafters.sh
# Builds bench_drafters for sm_90, then runs it on CUDA (bf16; batch 1 on 32 prompts, 8 and 32 on 200) and,
# at the same time on other cores, on the CPU (f32, single-threaded forward: one process per batch size and
# drafter, fewer prompts and new tokens). $OUT (default /tmp/kdt-drafters) gets drafters_cuda.csv,
# drafters_cuda.md, drafters_cpu.csv and drafters_logs.tgz; then
#   python3 python/plot_drafters.py --cuda drafters_cuda.csv --cpu drafters_cpu.csv
# makes docs/perf/drafters.png and docs/perf/drafters.md.
# Settings: MODEL, DRAFT (folders), GRID (small|full), CUDA_LIMITS, CPU_LIMITS, CPU_NEW, DEADLINE.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kdt-drafters}
BUILD=${BUILD:-build}
MODEL=${MODEL:-models/kdt-small}
DRAFT=${DRAFT:-models/kdt-small-draft}
GRID=${GRID:-small}
CUDA_LIMITS=${CUDA_LIMITS:-32,200,200}
CPU_LIMITS=${CPU_LIMITS:-4,8,32}
CPU_NEW=${CPU_NEW:-64}
DEADLINE=${DEADLINE:-560}  # seconds: the device tool stops a command at 600
WORK=$(mktemp -d)          # per-process outputs; only a few files go to $OUT (it returns at most 8)
mkdir -p "$OUT"

MAKEVARS=(BUILD="$BUILD" CUDA_ARCH="-gencode arch=compute_90a,code=sm_90a")
source scripts/gpu_deps.sh  # libcjson, PCRE2, libmicrohttpd from .deb/ where missing
for f in "$MODEL/config.json" "$DRAFT/config.json" "$MODEL/heldout_prompts.ids"; do
    [ -f "$f" ] || { echo "gpu_drafters: $f is missing (scripts/gpu_train_small.sh makes the models)"; exit 1; }
done

echo "## build"
if ! timeout 300 make -j"$(nproc)" "${MAKEVARS[@]}" "$BUILD/bench/bench_drafters" >"$WORK/build.log" 2>&1; then
    tail -30 "$WORK/build.log"
    tar -czf "$OUT/drafters_logs.tgz" -C "$WORK" .
    exit 1
fi
echo "## built in $SECONDS s"
BENCH=$BUILD/bench/bench_drafters
left=$((DEADLINE - SECONDS - 40))
command -v taskset >/dev/null || taskset() { shift 2; "$@"; }
ncpu=$(nproc)
cuda_cores="0-3" cpu_cores="4-$((ncpu - 1))"
[ "$ncpu" -lt 8 ] && cuda_cores="0-$((ncpu - 1))" cpu_cores="0-$((ncpu - 1))"

# CPU, f32: one process per (batch size, drafter), cheapest grid points first, each within the time left
pids=()
i=0
for b in 1 8 32; do
    i=$((i + 1))
    lim=$(echo "$CPU_LIMITS" | cut -d, -f$i)
    for d in lookup model prefix-1 prefix-2; do
        taskset -c "$cpu_cores" timeout "$left" "$BENCH" --backend cpu --model "$MODEL" --draft-model "$DRAFT" \
            --batches "$b" --limits "$lim" --max-new "$CPU_NEW" --drafters "$d" --grid "$GRID" \
            --time-budget $((left - 60)) --csv "$WORK/cpu_b${b}_$d.csv" --out "$WORK/cpu_b${b}_$d.md" \
            >"$WORK/cpu_b${b}_$d.log" 2>&1 &
        pids+=($!)
    done
done

echo "## cuda (bf16), limits $CUDA_LIMITS, grid $GRID, $left s at most"
taskset -c "$cuda_cores" timeout "$left" "$BENCH" --backend cuda --model "$MODEL" --draft-model "$DRAFT" \
    --batches 1,8,32 --limits "$CUDA_LIMITS" --max-new 96 --grid "$GRID" --time-budget $((left - 50)) \
    --csv "$OUT/drafters_cuda.csv" --out "$OUT/drafters_cuda.md" 2>&1 | tee "$WORK/cuda.log"
echo "## cuda: exit ${PIPESTATUS[0]} at $SECONDS s"

rc_cpu=0
for p in "${pids[@]}"; do wait "$p" || rc_cpu=$((rc_cpu + 1)); done
echo "## cpu: $rc_cpu of ${#pids[@]} processes did not finish every run (3: runs skipped past the time budget) at $SECONDS s"
# one CPU table: the header once, each batch size's none row once
awk -F, 'FNR == 1 { if (!h++) print; next } $4 == "none" { if (seen[$3]++) next } { print }' \
    "$WORK"/cpu_b*_*.csv >"$OUT/drafters_cpu.csv" 2>/dev/null
grep -h '^| ' "$WORK"/cpu_b*_*.md | grep -v 'batch | drafter\|---' | sort -t'|' -k2,2n -k3,3 \
    | awk -F'|' '$3 ~ /none/ { if (seen[$2]++) next } { print }' >"$WORK/cpu_rows.md"
tar -czf "$OUT/drafters_logs.tgz" -C "$WORK" .
echo "## CPU rows (f32):"
cat "$WORK/cpu_rows.md"
echo "## fastest per batch size, cuda:"
sed -n '/Fastest per batch size/,$p' "$OUT/drafters_cuda.md" 2>/dev/null
ls -l "$OUT"
