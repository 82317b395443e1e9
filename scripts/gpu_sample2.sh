#!/usr/bin/env bash
# Sampling, second round, on a GPU machine in under 300 s: builds for sm_90a, then
#   - tree_sample_accept on CUDA: the numpy bundles exact, CUDA == CPU bit for bit on random batches
#     up to V = 163840 (the filters' new coarse path), the statistical tests on CUDA;
#   - the model drafter's sampled children: tests/test_sample_drafter (chi-square against the
#     target's exact joint of three tokens, its power, a wrong drafter rejected) on CPU and CUDA;
#   - bench_sample_accept: the filters' coarse path beside the radix selects (before / after) in
#     the same run, with a check that both give the same outputs;
#   - the shipped model (models/kdt-small): accepted length and tokens/s at T = 0, 0.6, 1.0 for
#     none / lookup / model (bench_drafters), and the first tokens over 4096 seeds, plain vs
#     speculative, two-sample chi-square (bench_sample_dist);
#   - racecheck over the op's test (quick mode) if time is left.
# One summary line per step; logs and tables under $OUT (default /tmp/kdt-gpu-sample2).
#   bash scripts/gpu_sample2.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kdt-gpu-sample2}
LOGS="$OUT/logs"
mkdir -p "$LOGS"
BUILD=${BUILD:-build}
SEED=${KDT_SEED:-$(( ($(date +%s) ^ $$) % 1000000 ))}
export KDT_TEST_DATA="$BUILD/data"
LIMIT=290  # seconds: later steps are skipped past it
summary=()
note() { summary+=("$*"); echo "## $*"; }

MAKEVARS=(BUILD="$BUILD" CUDA_ARCH="-gencode arch=compute_90a,code=sm_90a")
source scripts/gpu_deps.sh  # libcjson, PCRE2, libmicrohttpd from .deb/ where missing

left() { echo $(( LIMIT - SECONDS )); }
step() {  # step NAME TIMEOUT CMD...: CMD with a time limit (cut to what is left), logged to $LOGS/NAME.log
    local name=$1 limit=$2; shift 2
    [ "$(left)" -lt 10 ] && { note "$name: SKIPPED (time)"; return 1; }
    [ "$limit" -gt "$(left)" ] && limit=$(left)
    local t0=$SECONDS
    timeout "$limit" "$@" >"$LOGS/$name.log" 2>&1
    local rc=$?
    note "$name: exit $rc in $((SECONDS - t0)) s, $(grep -c '^PASS ' "$LOGS/$name.log") PASS, $(grep -c '^FAIL ' "$LOGS/$name.log") FAIL, $(grep -c '^SKIP ' "$LOGS/$name.log") SKIP"
    grep -E '^FAIL ' "$LOGS/$name.log" | head -10 | cut -c1-240
    return $rc
}

nvidia-smi --query-gpu=name,driver_version --format=csv,noheader >"$LOGS/info.log" 2>&1
note "gpu: $(head -1 "$LOGS/info.log"); commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
T="$BUILD/tests/test_tree_sample_accept $BUILD/tests/test_sample_stats $BUILD/tests/test_sample_drafter"
B="$BUILD/bench/bench_sample_accept $BUILD/bench/bench_drafters $BUILD/bench/bench_sample_dist $BUILD/kdt"
step build 180 make -j16 "${MAKEVARS[@]}" $T $B \
    || { tail -30 "$LOGS/build.log"; printf '%s\n' "${summary[@]}"; exit 1; }

rm -rf "$KDT_TEST_DATA"; mkdir -p "$KDT_TEST_DATA"
step bundles 30 python3 python/gen_tree_sample_accept.py --out "$KDT_TEST_DATA" --seed "$SEED"
note "bundle seed $SEED (KDT_SEED=$SEED replays it)"
step test_tree_sample_accept 40 "$BUILD/tests/test_tree_sample_accept"
grep -E '^(PASS|FAIL)  .*cuda.*(random|163840)' "$LOGS/test_tree_sample_accept.log" | head -4 | cut -c1-200
step bench_sample_accept 60 "$BUILD/bench/bench_sample_accept" --out "$OUT/bench_sample_accept.md"
grep -E '^\| T=|^### B=64' "$OUT/bench_sample_accept.md" 2>/dev/null | head -8
step test_sample_drafter 90 "$BUILD/tests/test_sample_drafter"
grep -E '^(PASS|FAIL)  .*cuda' "$LOGS/test_sample_drafter.log" | cut -c1-200
step test_sample_stats 60 "$BUILD/tests/test_sample_stats"
grep -E '^FAIL|wrong rule' "$LOGS/test_sample_stats.log" | grep cuda | head -4 | cut -c1-200
for run in 1 2; do  # the sampled model drafter on cuda: the same seed twice, the same tokens
    timeout 30 "$BUILD/kdt" generate --backend cuda --prompt-ids 5,6,7,5,6,7,5,6 --max-new 24 --spec model --temperature 0.8 \
        --top-k 40 --top-p 0.95 --seed 7 >"$LOGS/generate_model_$run.txt" 2>>"$LOGS/generate.log"
done
cmp -s "$LOGS/generate_model_1.txt" "$LOGS/generate_model_2.txt" && [ -s "$LOGS/generate_model_1.txt" ] && r=same || r=DIFFERENT
note "kdt generate --spec model --temperature 0.8 --seed 7 twice on cuda: $r ($(head -c 60 "$LOGS/generate_model_1.txt"))"

# The temperature table on the shipped model: one batch of the first 8 held-out prompts, 96 tokens.
M=models/kdt-small
for T in 0 0.6 1.0; do
    step "drafters_T$T" 40 "$BUILD/bench/bench_drafters" --model $M --draft-model models/kdt-small-draft --limit 8 \
        --batches 8 --max-new 96 --grid one --drafters lookup,model --prefix-layers 0 --temperature $T --top-p 0.95 \
        --seed 1 --backend cuda --out "$OUT/drafters_T$T.md"
    grep -E '^\| 8 ' "$LOGS/drafters_T$T.log" | sed "s/^/T=$T /"
done
{
    echo "| T | drafter | tokens/s (8 requests) | vs none | mean accepted length | tokens/step |"
    echo "|---|---|---:|---:|---:|---:|"
    for T in 0 0.6 1.0; do
        grep -E '^\| 8 ' "$OUT/drafters_T$T.md" 2>/dev/null | awk -F'|' -v T=$T '{printf "| %s |%s|%s|%s|%s|%s|\n", T, $3, $8, $9, $10, $11}'
    done
} >"$OUT/temperature_table.md"
cat "$OUT/temperature_table.md"
step sample_dist 50 "$BUILD/bench/bench_sample_dist" --model $M --draft-model models/kdt-small-draft --seeds 4096 \
    --temperature 1.0 --top-p 0.95 --backend cuda --out "$OUT/sample_dist.md"
grep -E '^\| plain' "$LOGS/sample_dist.log"
KDT_TEST_QUICK=1 step racecheck 60 compute-sanitizer --tool racecheck --error-exitcode 9 "$BUILD/tests/test_tree_sample_accept"
grep -E 'RACECHECK SUMMARY|ERROR SUMMARY' "$LOGS/racecheck.log" 2>/dev/null | head -2
note "total $SECONDS s"
echo
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
