#!/usr/bin/env bash
# The forward's GPU run: builds what it needs, checks the device MoE and the CUDA graphs
# (tests/test_model_graph), times the model with and without them beside the previous commit's
# binaries, then the older tests and the speculative bench as time allows. Most important first;
# a step that would pass $DEADLINE (seconds since the start, default 300) is skipped and says so.
#   OUT=/tmp/out bash scripts/gpu_forward.sh
# Baseline: where base-build/ holds the previous commit's build (bench/bench_model, bench/bench_spec,
# kdt), they run beside the new ones with the same arguments. Flags: KDT_MODEL_FLAGS=0 is the old
# path; 3 is the device MoE plus graphs; 7 adds the small-batch projections (include/kdt/model.h).
# DEADLINE=560 leaves room for every step. Every step prints one line:
#   PASS|FAIL|SKIP  <step> (exit, seconds) [figures]
# and its log is $OUT/logs/<step>.log; the last line counts them.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kdt-forward}
LOGS="$OUT/logs"
mkdir -p "$LOGS"
BUILD=${BUILD:-build}
DEADLINE=${DEADLINE:-300}
JOBS=${JOBS:-16}
npass=0 nfail=0 nskip=0

MAKEVARS=(BUILD="$BUILD" CUDA_ARCH="-gencode arch=compute_90a,code=sm_90a")
source scripts/gpu_deps.sh  # libcjson, PCRE2, libmicrohttpd from .deb/ where missing

source scripts/gpu_steps.sh  # say, step, test_counts

: >"$OUT/summary.txt"
say "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1); commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
say "baseline binaries: $([ -d base-build ] && ls base-build/bench/bench_model base-build/bench/bench_spec base-build/kdt 2>/dev/null | tr '\n' ' ' || echo none)"

T="$BUILD/tests" B="$BUILD/bench"
step build 240 make -j"$JOBS" "${MAKEVARS[@]}" "$T/test_model_graph" "$T/test_model_cuda" "$T/test_spec" "$B/bench_model" \
    "$B/bench_spec" "$BUILD/kdt" || tail -30 "$LOGS/build.log"

# 1. The new checks: device MoE against cuBLAS, graphs bit for bit, run-to-run determinism.
step test_model_graph 90 "$T/test_model_graph"
test_counts test_model_graph

# 2. bench_model: the old path, the new path, the previous commit.
for f in 0 3 7; do
    KDT_MODEL_FLAGS=$f step "bench_model_flags$f" 90 "$B/bench_model" --out "$OUT/bench_model_flags$f.md" &&
        grep -E '^\| +(1|8|32) \|' "$OUT/bench_model_flags$f.md" | sed "s/^/      flags $f /" | tee -a "$OUT/summary.txt"
done
if [ -x base-build/bench/bench_model ]; then
    step bench_model_base 90 base-build/bench/bench_model --out "$OUT/bench_model_base.md" &&
        grep -E '^\| +(1|8|32) \|' "$OUT/bench_model_base.md" | sed 's/^/      base    /' | tee -a "$OUT/summary.txt"
fi
say "      columns: B | prefill tokens | prefill ms | prefill tok/s | decode ms | decode tok/s | verify ms | verify rows/s | decode floor ms | x floor | verify floor ms | x floor (base: no floor columns; built-in model first, then Kimi dims)"

# 3. kdt generate, built-in model, batch 1, greedy: decode tokens/s.
gen() { # gen NAME KDT FLAGS
    KDT_MODEL_FLAGS=$3 step "$1" 60 "$2" generate --prompt-ids 1,2,3,4,5,6,7,8 --max-new 512 --backend cuda &&
        say "      $(grep -E 'decode .* tokens/s' "$LOGS/$1.log" | head -1)"
}
gen generate_flags0 "$BUILD/kdt" 0 && g0=1
gen generate_flags3 "$BUILD/kdt" 3 && g3=1
gen generate_flags7 "$BUILD/kdt" 7
[ -x base-build/kdt ] && gen generate_base base-build/kdt 0
if [ -n "${g0:-}" ] && [ -n "${g3:-}" ]; then
    o0=$(grep -v '^kdt generate' "$LOGS/generate_flags0.log" | md5sum) o3=$(grep -v '^kdt generate' "$LOGS/generate_flags3.log" | md5sum)
    [ "$o0" = "$o3" ] && say "INFO  generate: the same 512 tokens with flags 0 and 3" ||
        say "INFO  generate: the tokens part between flags 0 and 3 (bf16: another summation order can flip a router near-tie; test_spec_flags3 checks f32)"
fi

# 4. The existing tests, unchanged, on the default path; then with the graphs on.
step test_model_cuda 120 "$T/test_model_cuda"
test_counts test_model_cuda
step test_spec 120 "$T/test_spec"
test_counts test_spec
KDT_MODEL_FLAGS=3 step test_model_cuda_flags3 120 "$T/test_model_cuda"
test_counts test_model_cuda_flags3
# The written all-experts checkpoint, 10 seeds, both paths (intermittent until its weights were zero-mean).
for f in 0 3; do
    KDT_MODEL_FLAGS=$f KDT_TEST_ONLY=checkpoint KDT_TEST_REPEAT=10 step "test_model_cuda_ckpt10_flags$f" 180 "$T/test_model_cuda"
    test_counts "test_model_cuda_ckpt10_flags$f"
done
KDT_MODEL_FLAGS=3 step test_spec_flags3 120 "$T/test_spec"
test_counts test_spec_flags3

# 5. bench_spec at batch 1: plain greedy and the drafters, old path, new path, previous commit.
for f in 0 3; do
    KDT_MODEL_FLAGS=$f step "bench_spec_flags$f" 120 "$B/bench_spec" --batches 1 --out "$OUT/bench_spec_flags$f.md" &&
        grep -E '^\| 1 \| (none|oracle)' "$OUT/bench_spec_flags$f.md" | sed "s/^/      flags $f /" | tee -a "$OUT/summary.txt"
done
if [ -x base-build/bench/bench_spec ]; then
    step bench_spec_base 120 base-build/bench/bench_spec --batches 1 --out "$OUT/bench_spec_base.md" &&
        grep -E '^\| 1 \| (none|oracle)' "$OUT/bench_spec_base.md" | sed 's/^/      base    /' | tee -a "$OUT/summary.txt"
fi

# 6. Memory checks of the new kernels and the graph path.
command -v compute-sanitizer >/dev/null &&
    step sanitize_test_model_graph 150 compute-sanitizer --tool memcheck --error-exitcode 9 "$T/test_model_graph" &&
    say "      $(grep -E 'ERROR SUMMARY' "$LOGS/sanitize_test_model_graph.log" | tail -1)"

say "gpu_forward: $npass passed, $nfail failed, $nskip skipped in $SECONDS s (logs: $LOGS)"
