# Sourced by the GPU scripts after they set OUT, LOGS and DEADLINE (seconds since the start):
#   say LINE...          prints the line and keeps it in $OUT/summary.txt
#   step NAME LIMIT CMD  runs CMD under LIMIT seconds, cut to what is left before DEADLINE, its output
#                        in $LOGS/NAME.log; prints PASS|FAIL|SKIP NAME (exit, seconds) and counts them
#                        in npass, nfail, nskip. (scripts/gpu_forward.sh and the older scripts hold
#                        copies of these that can source this file instead.)
npass=0 nfail=0 nskip=0
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
