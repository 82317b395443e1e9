# Sourced by the GPU scripts that print "## " summary lines (gpu_check, gpu_quant, gpu_quant_wire,
# gpu_verify_seesaw, gpu_multi, gpu_multi_bench) after they set LOGS and DEADLINE (seconds since the
# script's start); STEP_MIN_S (default 5): a step with less time than that left is skipped.
#   note LINE...            prints "## LINE" and keeps it in the summary array
#   step NAME LIMIT CMD...  CMD under LIMIT seconds, cut to what is left before DEADLINE, its output in
#                           $LOGS/NAME.log; notes its exit code and time; returns its exit code
#   counts LOG              a test log's "P passed, F failed, S skipped" (its PASS / FAIL / SKIP lines)
#   tests NAME LIMIT        runs the test binary $T/NAME as a step, notes PASS / FAIL with its counts
summary=()
note() { summary+=("$*"); echo "## $*"; }
step() {
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS left=$((DEADLINE - SECONDS))
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -lt "${STEP_MIN_S:-5}" ]; then note "$name: skipped, out of time"; return 124; fi
    timeout "$limit" "$@" >"$LOGS/$name.log" 2>&1
    local rc=$?
    note "$name: exit $rc in $((SECONDS - t0)) s"
    return $rc
}
counts() { echo "$(grep -c '^PASS' "$1") passed, $(grep -c '^FAIL' "$1") failed, $(grep -c '^SKIP' "$1") skipped"; }
tests() {
    [ -x "$T/$1" ] || { note "$1: FAIL (not built)"; return; }
    step "$1" "$2" "$T/$1"
    local rc=$? f
    f=$(grep -c '^FAIL' "$LOGS/$1.log")
    grep -E '^FAIL ' "$LOGS/$1.log" | head -10
    note "$1: $([ "$rc" = 0 ] && [ "$f" = 0 ] && grep -q '^PASS' "$LOGS/$1.log" && echo PASS || echo FAIL) ($(counts "$LOGS/$1.log"), exit $rc)"
}
