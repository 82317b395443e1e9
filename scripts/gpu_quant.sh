#!/usr/bin/env bash
# Issue 23 on a GPU machine, in about five minutes: builds for sm_90 what the quantized checkpoints need,
# runs their tests (CPU loaders and fixtures, the quantized GEMM kernels, the CUDA forward on every fixture),
# `kdt generate` on the FP8 and INT4 fixtures on both backends, compute-sanitizer over the kernels' test,
# and bench_quant_gemm. Logs go to $OUT/logs (default /tmp/kdt-quant), the bench table to
# $OUT/bench_quant_gemm.md; a summary is printed last. No network: Debian's libcjson and libpcre2-dev
# travel as .deb files in .deb/ where the machine lacks them (apt-get download libcjson1 libcjson-dev
# libpcre2-dev libpcre2-8-0 libpcre2-16-0 libpcre2-32-0 libpcre2-posix3).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kdt-quant}
LOGS="$OUT/logs"
mkdir -p "$LOGS"
BUILD=${BUILD:-build}  # shared with scripts/gpu_check.sh (same sm_90 flags): a build there is reused
DEADLINE=${DEADLINE:-420}
source scripts/gpu_notes.sh  # note, step

MAKEVARS=(BUILD="$BUILD" CUDA_ARCH="-gencode arch=compute_90a,code=sm_90a")
source scripts/gpu_deps.sh  # libcjson, PCRE2, libmicrohttpd from .deb/ where missing
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$LOGS/info.log" 2>&1
note "gpu: $(head -1 "$LOGS/info.log")"

T="$BUILD/tests"
step build 200 make -j16 "${MAKEVARS[@]}" "$BUILD/kdt" "$T/test_quant" "$T/test_quant_gemm" "$T/test_model" "$T/test_model_cuda" \
    "$BUILD/bench/bench_quant_gemm" || tail -30 "$LOGS/build.log"

for t in test_quant_gemm test_quant test_model test_model_cuda; do
    [ -x "$T/$t" ] || { note "$t: not built"; continue; }
    step "$t" 60 "$T/$t"
    grep -E '^(FAIL|SKIP) ' "$LOGS/$t.log" | head -20
    note "$t: $(counts "$LOGS/$t.log")"
done

# generate on the quantized folders: the CUDA backend (bf16) next to the CPU (f32)
for fx in fp8 int4_k26; do
    for be in cpu cuda; do
        step "generate_${fx}_$be" 20 "$BUILD/kdt" generate --model "tests/fixtures/model/$fx" --prompt-ids 5,6,7,8 --max-new 16 \
            --backend "$be"
        note "generate $fx $be: $(grep -E '^[0-9]+( [0-9]+)+$' "$LOGS/generate_${fx}_$be.log" | head -1)"
    done
done

if command -v compute-sanitizer >/dev/null && [ -x "$T/test_quant_gemm" ]; then
    step sanitize_test_quant_gemm 40 compute-sanitizer --tool memcheck --error-exitcode 9 "$T/test_quant_gemm"
    grep -E 'ERROR SUMMARY' "$LOGS/sanitize_test_quant_gemm.log" | head -2
fi

[ -x "$BUILD/bench/bench_quant_gemm" ] && step bench_quant_gemm 150 "$BUILD/bench/bench_quant_gemm" --out "$OUT/bench_quant_gemm.md" &&
    grep -E '^\| (expert|dense|kv_a|o )|^- copy|^\| weight' "$OUT/bench_quant_gemm.md"

echo
echo "== summary (logs in $LOGS)"
printf '%s\n' "${summary[@]}"
