#!/usr/bin/env bash
# tree_sample_accept on a GPU machine, in one call of about 4 minutes: builds for sm_90,
# generates the numpy bundles, runs the op's tests (bundles exact on cpu and cuda, cuda == cpu bit
# for bit on random batches up to V = 163840, the statistical tests on both backends),
# compute-sanitizer memcheck and racecheck on the op's test, and the bench. Logs and the bench table
# go to $OUT (default /tmp/kdt-gpu-sample); a summary is printed last.
#   bash scripts/gpu_sample.sh            (MODEL=DIR: a trained checkpoint for the acceptance table)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kdt-gpu-sample}
LOGS="$OUT/logs"
mkdir -p "$LOGS"
BUILD=${BUILD:-build}
SEED=${KDT_SEED:-$(( ($(date +%s) ^ $$) % 1000000 ))}
export KDT_TEST_DATA="$BUILD/data"
summary=()
note() { summary+=("$*"); echo "## $*"; }

MAKEVARS=(BUILD="$BUILD" CUDA_ARCH="-gencode arch=compute_90a,code=sm_90a")
source scripts/gpu_deps.sh  # libcjson, PCRE2, libmicrohttpd from .deb/ where missing

step() {  # step NAME TIMEOUT CMD...: runs CMD with a time limit, logging to $LOGS/NAME.log
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS
    timeout "$limit" "$@" >"$LOGS/$name.log" 2>&1
    local rc=$?
    note "$name: exit $rc in $((SECONDS - t0)) s, $(grep -c '^PASS ' "$LOGS/$name.log") PASS, $(grep -c '^FAIL ' "$LOGS/$name.log") FAIL, $(grep -c '^SKIP ' "$LOGS/$name.log") SKIP"
    grep -E '^FAIL ' "$LOGS/$name.log" | head -10
    return $rc
}

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$LOGS/info.log" 2>&1
note "gpu: $(head -1 "$LOGS/info.log")"
T="$BUILD/tests/test_tree_sample_accept $BUILD/tests/test_sample_stats $BUILD/tests/test_sample_e2e $BUILD/tests/test_tree_accept"
step build 200 make -j16 "${MAKEVARS[@]}" $T "$BUILD/bench/bench_sample_accept" "$BUILD/kdt" "$BUILD/libkdt.so" \
    || { tail -30 "$LOGS/build.log"; printf '%s\n' "${summary[@]}"; exit 1; }
rm -rf "$KDT_TEST_DATA"; mkdir -p "$KDT_TEST_DATA"
step bundles 60 sh -c "python3 python/gen_tree_sample_accept.py --out $KDT_TEST_DATA --seed $SEED && python3 python/gen_tree_accept.py --out $KDT_TEST_DATA --seed $SEED"
note "bundle seed $SEED (KDT_SEED=$SEED replays it)"
step test_tree_sample_accept 60 "$BUILD/tests/test_tree_sample_accept"
step test_sample_stats 90 "$BUILD/tests/test_sample_stats"
grep -E 'cuda.*\((a|b)\) (first|token)|wrong rule' "$LOGS/test_sample_stats.log" | grep cuda | cut -c1-200
step test_sample_e2e 120 "$BUILD/tests/test_sample_e2e"
step test_tree_accept 60 "$BUILD/tests/test_tree_accept"
step pytest_sample 60 env KDT_LIB="$PWD/$BUILD/libkdt.so" KDT_BIN="$PWD/$BUILD/kdt" PYTHONPATH="$PWD/python" \
    python3 -m pytest -q -rs python/tests/test_sample_accept.py
tail -n 1 "$LOGS/pytest_sample.log"
for run in 1 2; do  # the CLI on cuda: the same seed twice gives the same tokens, plain and speculative
    for spec in none lookup model; do
        "$BUILD/kdt" generate --backend cuda --prompt-ids 5,6,7,5,6,7,5,6 --max-new 24 --spec $spec \
            --temperature 0.8 --top-k 40 --top-p 0.95 --seed 7 >"$LOGS/generate_${spec}_$run.txt" 2>>"$LOGS/generate.log"
    done
done
for spec in none lookup model; do
    cmp -s "$LOGS/generate_${spec}_1.txt" "$LOGS/generate_${spec}_2.txt" && r=same || r=DIFFERENT
    note "kdt generate --spec $spec --temperature 0.8 --seed 7 twice on cuda: $r ($(head -c 60 "$LOGS/generate_${spec}_1.txt"))"
done
step memcheck 60 compute-sanitizer --tool memcheck --error-exitcode 9 "$BUILD/tests/test_tree_sample_accept"
grep -E 'ERROR SUMMARY' "$LOGS/memcheck.log" | head -2
KDT_TEST_QUICK=1 step racecheck 90 compute-sanitizer --tool racecheck --error-exitcode 9 "$BUILD/tests/test_tree_sample_accept"
grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$LOGS/racecheck.log" | head -2
# Acceptance at three temperatures for each drafter : $MODEL if given, else the
# built-in model (random weights: its acceptance says little about a trained model's).
for T in 0 0.6 1.0; do
    for spec in lookup model; do
        "$BUILD/kdt" generate --backend cuda ${MODEL:+--model "$MODEL"} --prompt-ids 5,6,7,5,6,7,5,6 --max-new 128 \
            --spec $spec --temperature $T --seed 1 >/dev/null 2>"$LOGS/accept_T${T}_$spec.log"
        note "T=$T spec $spec: $(grep -oE 'mean accepted length [0-9.]+' "$LOGS/accept_T${T}_$spec.log"); $(grep -oE 'decode [0-9]+ tokens in [0-9.]+ s \([0-9.]+ tokens/s\)' "$LOGS/accept_T${T}_$spec.log")"
    done
done
step bench 120 "$BUILD/bench/bench_sample_accept" --out "$OUT/bench_sample_accept.md"
cat "$OUT/bench_sample_accept.md"
printf '%s\n' "${summary[@]}"
