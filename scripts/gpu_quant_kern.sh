#!/usr/bin/env bash
# Issue 23, the decode GEMM kernels, on a GPU machine in under 300 s: builds (sm_90a) libkdt,
# test_quant_gemm and bench_quant_gemm; runs test_quant_gemm (both decode kernels against the CPU,
# bit-identical to each other), bench_quant_gemm (baseline and streaming kernels in the same run, the
# device-copy ceiling and a read-only kernel's bandwidth measured in that run), then compute-sanitizer
# memcheck over the test if time is left. Logs in $OUT/logs, the bench table in $OUT/bench_quant_gemm.md;
# one summary line per step last. No network: see scripts/gpu_deps.sh.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kdt-quant-kern}
LOGS="$OUT/logs"
mkdir -p "$LOGS"
BUILD=${BUILD:-build}
DEADLINE=${DEADLINE:-295}
summary=()
note() { summary+=("$*"); echo "## $*"; }
step() {  # step NAME TIMEOUT CMD...: runs CMD with a time limit (cut to what is left), logging to $LOGS/NAME.log
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS left=$((DEADLINE - SECONDS))
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -lt 5 ]; then echo "out of time" >"$LOGS/$name.log"; return 124; fi
    timeout "$limit" "$@" >"$LOGS/$name.log" 2>&1
    local rc=$?
    echo "## $name: exit $rc in $((SECONDS - t0)) s"
    return $rc
}
why() { [ "$1" -eq 124 ] && echo "timed out" || echo "exit $1"; }  # why RC: a failed step's reason

MAKEVARS=(BUILD="$BUILD" CUDA_ARCH="-gencode arch=compute_90a,code=sm_90a")
source scripts/gpu_deps.sh
note "gpu: $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm,clocks.max.mem --format=csv,noheader 2>&1 | head -1)"

T="$BUILD/tests/test_quant_gemm" B="$BUILD/bench/bench_quant_gemm"
t0=$SECONDS
if step build 170 make -j16 "${MAKEVARS[@]}" "$T" "$B"; then note "build: PASS in $((SECONDS - t0)) s"
else note "build: FAIL ($(why $?), $LOGS/build.log)"; grep -E 'error' "$LOGS/build.log" | head -20; fi

if [ -x "$T" ]; then
    step test_quant_gemm 60 "$T"; rc=$?
    grep -E '^FAIL ' "$LOGS/test_quant_gemm.log" | head -20
    p=$(grep -c '^PASS' "$LOGS/test_quant_gemm.log"); f=$(grep -c '^FAIL' "$LOGS/test_quant_gemm.log")
    sk=$(grep -c '^SKIP' "$LOGS/test_quant_gemm.log")
    [ "$rc" -eq 0 ] && [ "$f" -eq 0 ] && [ "$p" -gt 0 ] && v=PASS || v=FAIL
    note "test_quant_gemm: $v ($p passed, $f failed, $sk skipped, $(why $rc))"
else note "test_quant_gemm: FAIL (not built)"; fi

MD="$OUT/bench_quant_gemm.md"
if [ -x "$B" ]; then
    step bench_quant_gemm 150 "$B" --out "$MD"; rc=$?
    if [ -s "$MD" ]; then
        grep -E '^- (copy|read)' "$MD"
        grep -E '^\| weight' "$MD" | head -1
        awk -F'|' '$4 ~ /^ *(1|8|32) *$/' "$MD"
        # stream of ceiling ($8), base of ceiling ($9) over the rows M = 1 .. 32
        s=$(awk -F'|' '$4 ~ /^ *(1|8|32) *$/ { gsub(/[ %]/, "", $8); gsub(/[ %]/, "", $9); v = $8 + 0; n++; s += v; b += $9;
              if (v >= 75) ok++; if (n == 1 || v < min) min = v }
              END { if (n) printf "%d rows at M = 1..32: streaming mean %.0f%% (min %d%%, %d rows >= 75%%), baseline mean %.0f%%", n, s / n, min, ok, b / n }' "$MD")
        note "bench_quant_gemm: $([ "$rc" -eq 0 ] && echo PASS || echo "FAIL ($(why $rc), partial table)"): $(grep -E '^- copy' "$MD" | grep -oE '[0-9]+ GB/s') copy ceiling; $s"
    else note "bench_quant_gemm: FAIL ($(why $rc), no table; $LOGS/bench_quant_gemm.log)"; tail -5 "$LOGS/bench_quant_gemm.log"; fi
else note "bench_quant_gemm: FAIL (not built)"; fi

if command -v compute-sanitizer >/dev/null && [ -x "$T" ]; then
    if step sanitize 60 compute-sanitizer --tool memcheck --error-exitcode 9 "$T"; then v=PASS; else v="FAIL ($(why $?))"; fi
    note "memcheck test_quant_gemm: $v, $(grep -E 'ERROR SUMMARY' "$LOGS/sanitize.log" | head -1)"
else note "memcheck test_quant_gemm: skipped (no compute-sanitizer or no test)"; fi

echo
echo "== summary ($SECONDS s; logs in $LOGS)"
printf '%s\n' "${summary[@]}"
