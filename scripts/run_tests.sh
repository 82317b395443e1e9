#!/usr/bin/env bash
# Runs every test of a built tree and ends with "N passed, M failed, K skipped".
#   bash scripts/run_tests.sh [BUILD_DIR]      (make test calls this after building)
# Reference bundles are generated fresh by python/gen_*.py with a new seed each run (KDT_SEED
# fixes it to replay a failure). Each test binary prints PASS/FAIL/SKIP lines; pytest's summary
# is counted too. A binary that exits non-zero without a FAIL line (a crash), or that reports no
# check at all, counts as a failure.
set -u
cd "$(dirname "$0")/.."
BUILD=${1:-build}
SEED=${KDT_SEED:-$(( ($(date +%s) ^ $$) % 1000000 ))}
export KDT_TEST_DATA="$BUILD/data"
export PYTHONPATH="$PWD/python${PYTHONPATH:+:$PYTHONPATH}"
passed=0; failed=0; skipped=0

count() {  # count PASS/FAIL/SKIP lines of a log; a non-zero exit with no FAIL line is one failure,
           # and so is a binary that reports no check at all (it checked nothing)
    local log=$1 rc=$2 p f s
    p=$(grep -c '^PASS ' "$log"); f=$(grep -c '^FAIL ' "$log"); s=$(grep -c '^SKIP ' "$log")
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; echo "FAIL  $3 exited with status $rc"; fi
    if [ $((p + f + s)) -eq 0 ]; then f=1; echo "FAIL  $3 reported no check (no PASS, FAIL or SKIP line)"; fi
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
}

echo "== generating reference bundles into $KDT_TEST_DATA (seed $SEED)"
rm -rf "$KDT_TEST_DATA"; mkdir -p "$KDT_TEST_DATA"
for gen in python/gen_*.py; do
    [ -e "$gen" ] || continue
    log=$(mktemp)
    python3 "$gen" --out "$KDT_TEST_DATA" --seed "$SEED" >"$log" 2>&1
    rc=$?
    if [ $rc -ne 0 ]; then cat "$log"; echo "FAIL  $gen exited with status $rc"; failed=$((failed + 1)); fi
    rm -f "$log"
done

for t in "$BUILD"/tests/test_*; do
    [ -x "$t" ] || continue
    echo "== $t"
    log=$(mktemp)
    "$t" 2>&1 | tee "$log"
    count "$log" "${PIPESTATUS[0]}" "$t"
    rm -f "$log"
done

if [ -d python/tests ]; then
    echo "== pytest python/tests"
    log=$(mktemp)
    KDT_LIB="$PWD/$BUILD/libkdt.so" KDT_BIN="$PWD/$BUILD/kdt" python3 -m pytest -q -rs python/tests 2>&1 | tee "$log"
    rc=${PIPESTATUS[0]}
    summary=$(grep -E '^[=]* ?[0-9]+ (passed|failed|skipped|error)' "$log" | tail -n 1)
    p=$(grep -oE '[0-9]+ passed' <<<"$summary" | grep -oE '[0-9]+'); f=$(grep -oE '[0-9]+ (failed|errors?)' <<<"$summary" | awk '{n += $1} END {print n + 0}')
    s=$(grep -oE '[0-9]+ skipped' <<<"$summary" | grep -oE '[0-9]+')
    p=${p:-0}; f=${f:-0}; s=${s:-0}
    if [ "$rc" -ne 0 ] && [ "$f" -eq 0 ]; then f=1; echo "FAIL  pytest exited with status $rc (5: no test collected)"; fi
    passed=$((passed + p)); failed=$((failed + f)); skipped=$((skipped + s))
    rm -f "$log"
fi

echo "seed $SEED (KDT_SEED=$SEED replays this run)"
echo "$passed passed, $failed failed, $skipped skipped"
[ "$failed" -eq 0 ]
