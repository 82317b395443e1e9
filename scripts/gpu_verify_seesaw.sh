#!/usr/bin/env bash
# Issue 22 on a GPU machine (H200), in under 420 s: builds for sm_90 (the sm90 kernels and dev/cuda
# for sm_90a), runs test_verify_attn_fast (the shipped kernels against the CPU reference, after the
# split walk moved into verify_attn_sm90_sched.cuh), the seesaw experiment's check against the
# shipped kernel (dev/cuda/verify_attn_sm90_seesaw.cu: the 7 issue shapes, tree masks, ragged
# lengths, block sizes 16/32, forced splits), its timing A/B (shipped vs seesaw, same split, median,
# L2 flushed), bench_verify_attn's split sweep (chosen vs forced parts, GB/s against the copy
# ceiling), ncu's tensor-pipe activity of both kernels on shape 0, and memcheck / racecheck of the
# seesaw kernel on the small shape. Logs in $OUT/logs (default /tmp/kdt-seesaw), tables in $OUT;
# one summary line per step, printed again at the end.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kdt-seesaw}
LOGS="$OUT/logs"
mkdir -p "$LOGS"
BUILD=${BUILD:-build}
DEADLINE=${DEADLINE:-405}
source scripts/gpu_notes.sh  # note, step

MAKEVARS=(BUILD="$BUILD" CUDA_ARCH="-gencode arch=compute_90a,code=sm_90a")
source scripts/gpu_deps.sh  # libcjson, PCRE2, libmicrohttpd from .deb/ where missing
nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader >"$LOGS/info.log" 2>&1
note "gpu: $(head -1 "$LOGS/info.log"), commit $(git rev-parse --short HEAD 2>/dev/null)"

T="$BUILD/tests" SS="$BUILD/dev/verify_attn_sm90_seesaw" BV="$BUILD/bench/bench_verify_attn"
step build 200 make -j16 "${MAKEVARS[@]}" "$T/test_verify_attn_fast" "$BV" "$SS" || tail -30 "$LOGS/build.log"

# 1. the shipped kernels against the CPU reference (the split walk is shared now)
if [ -x "$T/test_verify_attn_fast" ]; then
    step test_verify_attn_fast 90 "$T/test_verify_attn_fast"
    grep -E '^(FAIL|SKIP) ' "$LOGS/test_verify_attn_fast.log" | head -10
    note "test_verify_attn_fast: $(grep -c '^PASS' "$LOGS/test_verify_attn_fast.log") passed, $(grep -c '^FAIL' "$LOGS/test_verify_attn_fast.log") failed"
else
    note "test_verify_attn_fast: not built"
fi

# 2. the seesaw kernel against the shipped one, then the A/B
ss_ok=0
if [ -x "$SS" ]; then
    step seesaw_check 90 "$SS" --check-only && ss_ok=1
    grep -E '^FAIL' "$LOGS/seesaw_check.log" | head -10
    note "seesaw check: $(grep -c '^PASS  seesaw check' "$LOGS/seesaw_check.log") cases passed ($(grep -c 'bit-identical' "$LOGS/seesaw_check.log") bit-identical), $(grep -c '^FAIL  seesaw check' "$LOGS/seesaw_check.log") failed"
    if [ "$ss_ok" = 1 ] || grep -q '^PASS  seesaw check' "$LOGS/seesaw_check.log"; then
        step seesaw_ab 100 "$SS" --reps 30 --no-check
        grep -E '^\|' "$LOGS/seesaw_ab.log" > "$OUT/seesaw_ab.md"
        cat "$OUT/seesaw_ab.md"
        note "seesaw A/B (seesaw / shipped per shape): $(grep -E '^\| [0-9]' "$OUT/seesaw_ab.md" | awk -F'|' '{gsub(/ /,"",$6); printf "%s ", $6}')"
    else
        note "seesaw A/B: skipped (no check passed: a hang or a wrong kernel is not timed)"
    fi
else
    note "seesaw: not built"
fi

# 3. the split scheduler against forced splits, GB/s against the copy ceiling
if [ -x "$BV" ]; then
    step bench_split_sweep 110 "$BV" --reps 20 --no-fallback --out "$OUT/bench_verify_attn.md" --csv "$OUT/verify_attn.csv"
    grep -E '^ceilings|^\| [0-9]' "$LOGS/bench_split_sweep.log" | tail -8
    note "split sweep: $(grep -A 12 '^split sweep' "$LOGS/bench_split_sweep.log" | grep -E '^\| [0-9]' | awk -F'|' '{gsub(/ /,"",$3); gsub(/ /,"",$7); gsub(/ /,"",$10); printf "[%s: chosen %s best %s x%s] ", $2, $3, $7, $10}')"
    grep -E '^\| (64, 8|128, 8)' "$LOGS/bench_split_sweep.log" | tail -2 | while IFS= read -r l; do note "8-head: $l"; done
fi

# 4. tensor-pipe activity of both kernels on shape 0 (1,64,33,32768), the first launch of each
if command -v ncu >/dev/null && [ -x "$SS" ] && [ "$ss_ok" = 1 ]; then
    avail=$(ncu --query-metrics --chip gh100 2>/dev/null | awk '{print $1}')
    metrics=gpu__time_duration.sum
    for m in sm__pipe_tensor_op_gmma_cycles_active sm__pipe_tensor_op_hmma_cycles_active sm__inst_executed_pipe_tensor_op_gmma \
             sm__pipe_shared_cycles_active; do
        grep -qx "$m" <<<"$avail" && metrics+=",$m.avg.pct_of_peak_sustained_active"
    done
    step ncu_tensor 80 ncu --clock-control none --metrics "$metrics" -k 'regex:va_sm90_kernel|seesaw_kernel' -c 2 \
        "$SS" --check-only --shape 0
    grep -E 'va_sm90_kernel|seesaw_kernel|duration|pct_of_peak' "$LOGS/ncu_tensor.log" | head -16
    note "ncu ($metrics): $(grep -E 'pct_of_peak|duration' "$LOGS/ncu_tensor.log" | awk '{printf "%s=%s ", $1, $NF}')"
fi

# 5. sanitizers over the seesaw kernel on the small shape
if command -v compute-sanitizer >/dev/null && [ -x "$SS" ] && [ "$ss_ok" = 1 ]; then
    step seesaw_memcheck 45 compute-sanitizer --tool memcheck --error-exitcode 9 "$SS" --check-only --shape 4
    note "seesaw memcheck: $(grep -E 'ERROR SUMMARY' "$LOGS/seesaw_memcheck.log" | head -1)"
    step seesaw_racecheck 60 compute-sanitizer --tool racecheck --error-exitcode 9 "$SS" --check-only --shape 4
    note "seesaw racecheck: $(grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$LOGS/seesaw_racecheck.log" | head -1)"
fi

echo
echo "==== summary ($SECONDS s) ===="
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
