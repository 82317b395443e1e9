# Sourced by scripts/gpu_multi.sh and gpu_multi_bench.sh after they set LOGS and DEADLINE: note (a
# summary line, also printed at once) and step (a command under a time limit, logged to $LOGS/NAME.log).
summary=()
note() { summary+=("$*"); echo "## $*"; }
step() {  # step NAME TIMEOUT CMD...
    local name=$1 limit=$2; shift 2
    local t0=$SECONDS left=$((DEADLINE - SECONDS))
    [ "$left" -lt "$limit" ] && limit=$left
    if [ "$limit" -lt 5 ]; then note "$name: SKIP, out of time"; return 124; fi
    timeout "$limit" "$@" >"$LOGS/$name.log" 2>&1
    local rc=$?
    note "$name: exit $rc in $((SECONDS - t0)) s"
    return $rc
}
