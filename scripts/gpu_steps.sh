# Sourced by scripts/gpu_*.sh after they set OUT, LOGS, DEADLINE and npass=0 nfail=0 nskip=0:
#   say LINE               echo to stdout and $OUT/summary.txt
#   step NAME LIMIT CMD... CMD under a time limit (cut to what is left before DEADLINE, seconds since the
#                          script's start), logged to $LOGS/NAME.log; prints PASS|FAIL|SKIP NAME (exit, s)
#   test_counts NAME       a test binary's PASS / FAIL / SKIP counts and first failures from its log
say() { echo "$*" | tee -a "$OUT/summary.txt"; }

step() {
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS left=$((DEADLINE - SECONDS))
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -lt 15 ]; then say "SKIP  $name (out of time: ${left}s left)"; nskip=$((nskip + 1)); return 124; fi
    timeout "$limit" "$@" >"$LOGS/$name.log" 2>&1
    local rc=$?
    local verdict=PASS
    [ $rc -ne 0 ] && verdict=FAIL
    [ $rc -eq 124 ] && verdict="FAIL (timed out at ${limit}s)"
    say "$verdict  $name (exit $rc, $((SECONDS - t0)) s)"
    [ $rc -eq 0 ] && npass=$((npass + 1)) || nfail=$((nfail + 1))
    return $rc
}
test_counts() {
    local log="$LOGS/$1.log"
    say "      $(grep -c '^PASS ' "$log") PASS, $(grep -c '^FAIL ' "$log") FAIL, $(grep -c '^SKIP ' "$log") SKIP"
    grep -E '^FAIL ' "$log" | head -8 | sed 's/^/      /' | tee -a "$OUT/summary.txt"
}

