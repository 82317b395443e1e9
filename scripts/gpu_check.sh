#!/usr/bin/env bash
# Everything a GPU machine run does, in one call: build, the whole test suite, compute-sanitizer
# over the CUDA tests, the benchmarks. Logs and result tables go to $OUT (default /tmp/kdt-gpu),
# packed into $OUT/results.tgz; a short summary is printed last.
#   bash scripts/gpu_check.sh [STEP ...]    steps: info build test sanitize bench (default: all)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kdt-gpu}
LOGS="$OUT/logs"
mkdir -p "$LOGS"
STEPS=${*:-info build test sanitize bench}
BUILD=${BUILD:-build}
export PYTHONUNBUFFERED=1
has() { [[ " $STEPS " == *" $1 "* ]]; }

MAKEVARS=(BUILD="$BUILD" CUDA_ARCH="-gencode arch=compute_90a,code=sm_90a")
source scripts/gpu_deps.sh  # libcjson, PCRE2, libmicrohttpd from .deb/ where missing

DEADLINE=${DEADLINE:-560}  # seconds: the device tool stops a command at 600
STEP_MIN_S=10
source scripts/gpu_notes.sh  # note, step

if has info; then
    { nvidia-smi; nvcc --version; python3 -c 'import torch, numpy; print("torch", torch.__version__, "numpy", numpy.__version__)'; } \
        >"$LOGS/info.log" 2>&1
    note "gpu: $(nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv,noheader 2>&1 | head -1)"
fi

if has build; then
    step build 300 make -j16 "${MAKEVARS[@]}" || { tail -30 "$LOGS/build.log"; }
fi

if has test; then
    step test 300 bash scripts/run_tests.sh "$BUILD"
    grep -E '^(FAIL|SKIP) ' "$LOGS/test.log" | head -40
    note "test: $(tail -n 1 "$LOGS/test.log")"
fi

if has sanitize; then
    # memcheck over every test binary (the C tests run their CUDA paths where a GPU is present),
    # SAN_JOBS at a time (separate processes share the GPU), then racecheck on the two kernels
    # with shared-memory cooperation.
    san_one() {  # san_one TOOL TEST LIMIT: one sanitizer run, its verdict line in LOGS/TOOL_TEST.log
        local n extra=() rc; n=$(basename "$2")
        # NCCL probes kernel images of other architectures at init and handles the errors itself.
        [ "$n" = test_comm ] && extra=(--report-api-errors no)
        KDT_TEST_DATA="$BUILD/data" timeout "$3" compute-sanitizer --tool "$1" "${extra[@]}" --error-exitcode 9 "$2" \
            >"$LOGS/$1_$n.log" 2>&1
        rc=$?
        if grep -q 'terminated before first instrumented API call' "$LOGS/$1_$n.log"; then
            echo "$1 $n: exit 0 (no CUDA call: a CPU-only test)"
        else
            echo "$1 $n: exit $rc $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$LOGS/$1_$n.log" | tail -1)"
        fi
    }
    export -f san_one; export LOGS BUILD
    left=$((DEADLINE - SECONDS - 200))
    [ "$left" -gt 300 ] && left=300
    if [ "$left" -ge 30 ]; then
        find "$BUILD/tests" -maxdepth 1 -name 'test_*' -type f -perm -u+x | sort | xargs -P "${SAN_JOBS:-6}" -I{} bash -c "san_one memcheck {} $left" \
            | tee "$LOGS/memcheck_summary.log"
        note "memcheck: $(grep -c 'exit 0 ' "$LOGS/memcheck_summary.log") clean of $(wc -l <"$LOGS/memcheck_summary.log") test binaries"
    else
        note "memcheck: skipped, out of time"
    fi
    for t in test_verify_attn test_tree_build; do
        [ -x "$BUILD/tests/$t" ] || continue
        left=$((DEADLINE - SECONDS - 10))
        [ "$left" -gt 240 ] && left=240
        [ "$left" -lt 30 ] && { note "racecheck $t: skipped, out of time"; continue; }
        r=$(san_one racecheck "$BUILD/tests/$t" "$left"); note "$r"
    done
fi

if has bench; then
    b="$BUILD/bench"
    [ -x "$b/bench_tree_build" ] && step bench_tree_build 120 "$b/bench_tree_build" --out "$OUT/bench_tree_build.md"
    [ -x "$b/bench_accept" ] && step bench_accept 120 "$b/bench_accept" --out "$OUT/bench_accept.md"
    [ -f bench/torch_accept.py ] && step torch_accept 120 python3 bench/torch_accept.py --kdt "$BUILD/kdt" --out "$OUT/torch_accept.md"
    [ -f bench/torch_sdpa_verify.py ] && step torch_sdpa_verify 120 python3 bench/torch_sdpa_verify.py --csv "$OUT/torch_sdpa_verify.csv"
    [ -x "$b/bench_verify_attn" ] && step bench_verify_attn 240 "$b/bench_verify_attn" --torch-csv "$OUT/torch_sdpa_verify.csv" \
        --out "$OUT/bench_verify_attn.md" --csv "$OUT/verify_attn.csv" \
        && step plot_verify_attn 60 python3 bench/plot_verify_attn.py "$OUT/verify_attn.csv" --out "$OUT/verify_attn.png"
    [ -f bench/peer_bench.py ] && KDT_LIB="$PWD/$BUILD/libkdt.so" PYTHONPATH="$PWD/python" \
        step peer_bench 200 python3 bench/peer_bench.py --out "$OUT/peer_bench.md"
    [ -x "$b/bench_model" ] && step bench_model 200 "$b/bench_model" --out "$OUT/bench_model.md"
    [ -x "$b/bench_spec" ] && step bench_spec 240 "$b/bench_spec" --out "$OUT/bench_spec.md"
fi

tar -czf "$OUT/results.tgz" -C "$OUT" logs $(cd "$OUT" && ls *.md *.csv *.png 2>/dev/null)
printf '%s\n' "${summary[@]}"
