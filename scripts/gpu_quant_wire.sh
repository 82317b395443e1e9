#!/usr/bin/env bash
# Issue 23, weights kept quantized on the GPU (src/model/cuda/linear.cu, moe.cu's quantized experts), on
# one H200 in under 420 s: builds for sm_90a; runs test_quant_cuda (the FP8 and INT4 fixtures through the
# CUDA forward against their dequantized twins and the CPU); `kdt generate` on both fixtures on both
# backends (the CUDA ids must equal the CPU's); test_model_graph; bench_model_quant (K2.6-layout INT4 and
# DeepSeek-V3-layout FP8 decode at batch 1, 8, 32 against the bytes-over-bandwidth floor, memory per layer
# against bf16); last test_model_cuda (every fixture). Logs in $OUT/logs, the bench's tables in
# $OUT/bench_model_quant.md; one summary line per step, printed last.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kdt-quant-wire}
LOGS="$OUT/logs"
mkdir -p "$LOGS"
BUILD=${BUILD:-build}
DEADLINE=${DEADLINE:-410}
source scripts/gpu_notes.sh  # note, step
run_tests() {  # run_tests TIMEOUT NAME...: each test binary, its FAIL/SKIP lines and counts
    local limit=$1 t; shift
    for t in "$@"; do
        [ -x "$T/$t" ] || { note "$t: not built"; continue; }
        step "$t" "$limit" "$T/$t"
        grep -E '^(FAIL|SKIP) |device bytes' "$LOGS/$t.log" | head -20
        note "$t: $(counts "$LOGS/$t.log")"
    done
}

MAKEVARS=(BUILD="$BUILD" CUDA_ARCH="-gencode arch=compute_90a,code=sm_90a")
source scripts/gpu_deps.sh
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$LOGS/info.log" 2>&1
note "gpu: $(head -1 "$LOGS/info.log")"

T="$BUILD/tests"
step build 220 make -j16 "${MAKEVARS[@]}" "$BUILD/kdt" "$T/test_quant_cuda" "$T/test_model_graph" "$T/test_model_cuda" \
    "$T/test_model_moe_emu" "$BUILD/bench/bench_model_quant" || tail -30 "$LOGS/build.log"

run_tests 60 test_quant_cuda test_model_moe_emu

# kdt generate on the K2.6-layout INT4 and the DeepSeek-V3-layout FP8 folders: CUDA (quantized weights) against the CPU (exact f32)
# from the fixture's own prompt (printed by test_quant_cuda), where its greedy steps have margins
for fx in int4_k26 fp8; do
    ids=$(sed -n "s/^$fx prompt ids: //p" "$LOGS/test_quant_cuda.log" 2>/dev/null | head -1)
    for be in cpu cuda; do
        step "generate_${fx}_$be" 30 "$BUILD/kdt" generate --model "tests/fixtures/model/$fx" --prompt-ids "${ids:-5,6,7,8}" \
            --max-new 16 --backend "$be"
    done
    a=$(grep -E '^[0-9]+( [0-9]+)+$' "$LOGS/generate_${fx}_cpu.log" | head -1)
    b=$(grep -E '^[0-9]+( [0-9]+)+$' "$LOGS/generate_${fx}_cuda.log" | head -1)
    if [ -n "$b" ] && [ "$a" = "$b" ]; then note "PASS generate $fx cuda = cpu: $b"; else note "FAIL generate $fx: cpu '$a' cuda '$b'"; fi
done

run_tests 50 test_model_graph

[ -x "$BUILD/bench/bench_model_quant" ] &&
    step bench_model_quant 120 "$BUILD/bench/bench_model_quant" --decode 16
cp "$LOGS/bench_model_quant.log" "$OUT/bench_model_quant.md" 2>/dev/null
grep -E '^(\||#)' "$LOGS/bench_model_quant.log" 2>/dev/null
while read -r line; do note "bench: $line"; done < <(grep -E '^## |^\| (1|8|32) \|' "$LOGS/bench_model_quant.log" 2>/dev/null)

run_tests 60 test_model_cuda  # last: every fixture, on what time is left

echo
echo "== summary (logs in $LOGS)"
printf '%s\n' "${summary[@]}"
