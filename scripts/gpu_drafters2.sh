#!/usr/bin/env bash
# The DFlash and MTP drafters on the GPU (issue 24), in one call of under 420 s:
#   OUT=/tmp/out bash scripts/gpu_drafters2.sh
# 1. build; 2. tests/test_spec_drafters_cuda (the CUDA drafters against the CPU ones, speculative output
# equal to greedy on CUDA) and, on other cores at the same time, the CPU drafter tests; 3. kdt generate
# --backend cuda with --spec dflash and --spec mtp against --spec none on the shipped model, token for
# token; 4. the acceptance table (bench_drafters --grid ct: chain against tree verification at the
# same verify budget, lookup, the small draft model, dflash and mtp, batch 1, 8, 32), greedy; 5. the
# cost of a DFlash step against the verify forward at Kimi K2's dims (bench_dflash_cost); 6. the
# acceptance table at temperature 0.6. Most important first; a step that would pass $DEADLINE (seconds
# since the start, default 400) is skipped and says so. Every step prints one line:
#   PASS|FAIL|SKIP  <step> (exit, seconds) [figures]
# (a table step's exit 3: bench_drafters skipped runs past its time budget; the rows it ran are in the table)
# its log is $OUT/logs/<step>.log; the tables ready for docs/perf/drafters.md are
#   $OUT/drafters2_greedy.md / .csv, $OUT/drafters2_t06.md / .csv, $OUT/dflash_cost.md.
# Settings: MODEL, DRAFT, DFLASH, MTP (folders), LIMITS (prompts per batch size), NEW (tokens per prompt).
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kdt-drafters2}
LOGS="$OUT/logs"
mkdir -p "$LOGS"
BUILD=${BUILD:-build}
DEADLINE=${DEADLINE:-400}
JOBS=${JOBS:-16}
MODEL=${MODEL:-models/kdt-small}
DRAFT=${DRAFT:-models/kdt-small-draft}
DFLASH=${DFLASH:-models/kdt-small-dflash}
MTP=${MTP:-models/kdt-small-mtp}
LIMITS=${LIMITS:-8,32,64}
NEW=${NEW:-48}
npass=0 nfail=0 nskip=0
MAKEVARS=(BUILD="$BUILD" CUDA_ARCH="-gencode arch=compute_90a,code=sm_90a")
source scripts/gpu_deps.sh  # libcjson, PCRE2, libmicrohttpd from .deb/ where missing

source scripts/gpu_steps.sh  # say, step, test_counts

: >"$OUT/summary.txt"
say "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1); commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
have_dflash=0 have_mtp=0
[ -f "$DFLASH/config.json" ] && have_dflash=1
[ -f "$MTP/config.json" ] && have_mtp=1
say "trained drafters: dflash $([ $have_dflash = 1 ] && echo "$DFLASH" || echo "MISSING ($DFLASH: the tables run without it)"),"\
" mtp $([ $have_mtp = 1 ] && echo "$MTP" || echo "MISSING ($MTP: the tables run without it)")"

T="$BUILD/tests" B="$BUILD/bench"
step build 200 make -j"$JOBS" "${MAKEVARS[@]}" "$T/test_spec_drafters_cuda" "$T/test_spec_dflash" "$T/test_spec_mtp" \
    "$B/bench_drafters" "$B/bench_dflash_cost" "$BUILD/kdt" || tail -30 "$LOGS/build.log"

# 2. CUDA drafters; the CPU tests at the same time, on the cores the GPU runs leave idle.
nice -n 5 bash -c "$T/test_spec_dflash > $LOGS/test_spec_dflash.log 2>&1; $T/test_spec_mtp > $LOGS/test_spec_mtp.log 2>&1" &
cpu_pid=$!
step test_spec_drafters_cuda 90 "$T/test_spec_drafters_cuda"
test_counts test_spec_drafters_cuda

# 3. kdt generate on CUDA: each drafter's ids equal --spec none's.
gen() { "$BUILD/kdt" generate --backend cuda --model "$MODEL" --prompt-ids "$(head -1 "$MODEL/heldout_prompts.ids" | tr ' ' ,)" \
        --max-new 64 "$@"; }
generate_check() {
    gen --spec none >"$OUT/gen_none.txt" || return 1
    local rc=0 s
    for s in dflash mtp; do
        local dir=$DFLASH; [ $s = mtp ] && dir=$MTP
        [ -f "$dir/config.json" ] || { echo "$s: $dir missing"; continue; }
        for dkn in "7 1 7" "7 4 16"; do
            set -- $dkn
            gen --spec $s --draft-model "$dir" --depth $1 --topk $2 --budget $3 >"$OUT/gen_$s.txt" 2>"$OUT/gen_$s.err" || { rc=1; cat "$OUT/gen_$s.err"; continue; }
            if cmp -s "$OUT/gen_none.txt" "$OUT/gen_$s.txt"; then echo "$s D=$1 K=$2 N=$3: equal to none; $(grep -i 'accepted' "$OUT/gen_$s.err" | head -1)"
            else echo "$s D=$1 K=$2 N=$3: DIFFERS from none"; rc=1; fi
        done
    done
    return $rc
}
export BUILD MODEL OUT DFLASH MTP
step generate 60 bash -c "$(declare -f gen generate_check); generate_check"
sed 's/^/      /' "$LOGS/generate.log" | tee -a "$OUT/summary.txt"

# 4-6. Tables and the cost bench.
drafters=lookup,model
extra=()
[ $have_dflash = 1 ] && drafters+=,dflash && extra+=(--dflash "$DFLASH")
[ $have_mtp = 1 ] && drafters+=,mtp && extra+=(--mtp "$MTP")
table() {  # NAME TEMPERATURE SECONDS
    local left=$((DEADLINE - SECONDS - 10))
    [ "$left" -gt "$3" ] && left=$3
    step "$1" $((left + 10)) "$B/bench_drafters" --backend cuda --model "$MODEL" --draft-model "$DRAFT" "${extra[@]}" \
        --drafters "$drafters" --grid ct --batches 1,8,32 --limits "$LIMITS" --max-new "$NEW" --temperature "$2" \
        --time-budget "$left" --prefix-layers 0 --csv "$OUT/$1.csv" --out "$OUT/$1.md"
    # chain against tree per drafter and batch: the accepted length at N = 4 and N = 7
    awk -F, 'NR > 1 && $18 != "-" { k = $3 "," $4 "," $7; a[k "," $18] = $13 }
             END { for (k in a) { split(k, f, ","); if (f[4] != "chain") continue;
                   t = f[1] "," f[2] "," f[3] ",tree"; if (t in a)
                   printf "      batch %s %s N=%s: accepted chain %.2f, tree %.2f\n", f[1], f[2], f[3], a[k], a[t] } }' \
        "$OUT/$1.csv" 2>/dev/null | sort | tee -a "$OUT/summary.txt"
}
table drafters2_greedy 0 120
step dflash_cost 90 "$B/bench_dflash_cost" --reps 10 --out "$OUT/dflash_cost.md"
grep '^| [0-9]' "$OUT/dflash_cost.md" 2>/dev/null | sed 's/^/      /' | tee -a "$OUT/summary.txt"
table drafters2_t06 0.6 100

wait "$cpu_pid"
for t in test_spec_dflash test_spec_mtp; do say "cpu   $t: $(grep -c '^PASS ' "$LOGS/$t.log") PASS, $(grep -c '^FAIL ' "$LOGS/$t.log") FAIL"; done
tar -czf "$OUT/drafters2_logs.tgz" -C "$OUT" logs 2>/dev/null
say "done in $SECONDS s: $npass passed, $nfail failed, $nskip skipped"
