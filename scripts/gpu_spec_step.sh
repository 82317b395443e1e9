#!/usr/bin/env bash
# Issue 21 (branch sp): what a speculative step costs at batch 1, beside main built in the same run
# (git archive $MAIN_REF into $BASE, else a copy of $MAIN_DIR, default /work/main). Steps, each cut to
# what is left before $DEADLINE (seconds since the start, default 170):
#   build      this tree and main's side by side, sm_90a only;
#   test_spec  the loop on the device (lookup's trees built and accepted on the host against the
#              device kernels' run, bit for bit; speculative against greedy);
#   bench_spec --batches 1 --drafters oracle: main, new (same synchronized timing), new --no-sync;
#   profile    KDT_SPEC_PROFILE=1 on new: the step's phases and the target forward's device time
#              (CUDA events), plain and lookup, on two prompts that run past their first token;
#   generate   kdt generate --backend cuda --model models/kdt-small --eos 1 --max-new 256 on the 8
#              held-out prompts (as bench/llamacpp/run.sh), plain and lookup at $SETTINGS, new and main
#              interleaved prompt by prompt, until 25 s before the deadline; tokens/s = tokens over
#              summed decode times; every output must equal its build's plain one (and main's plain).
# Prints PASS|FAIL|SKIP <step> (exit, s) per step, then INFO lines with the figures; the table in
# $OUT/spec_step.md, logs in $OUT/logs, the summary in $OUT/summary.txt.
#   OUT=/tmp/out bash scripts/gpu_spec_step.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kdt-spec-step}
LOGS="$OUT/logs"
mkdir -p "$LOGS/gen"
: >"$OUT/summary.txt"
npass=0 nfail=0 nskip=0
source scripts/gpu_steps.sh  # say, step, test_counts
source scripts/gpu_generate.sh  # gen_prompts, gen_table
DEADLINE=${DEADLINE:-170}
MODEL=models/kdt-small
SETTINGS=${SETTINGS:-"16,1,16 24,1,24 32,1,32 8,2,16"}
MAIN_REF=${MAIN_REF:-main}
BASE=${BASE:-/tmp/kdt-spec-step-main}
MAKEVARS=(CUDA_ARCH="-gencode arch=compute_90a,code=sm_90a")
source scripts/gpu_deps.sh  # libcjson, PCRE2, libmicrohttpd from .deb/ where missing
say "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1); this tree $(git rev-parse --short HEAD 2>/dev/null || echo '?'), main $(git rev-parse --short "$MAIN_REF" 2>/dev/null || echo '?')"

# 1. Main's tree ($MAIN_REF from git, else a copy of $MAIN_DIR), built beside this one.
rm -rf "$BASE" && mkdir -p "$BASE"
{ git archive "$MAIN_REF" | tar -x -C "$BASE"; } 2>"$LOGS/main_src.log" || [ -f "$BASE/Makefile" ] ||
    tar -C "${MAIN_DIR:-/work/main}" --exclude=.git --exclude='./build*' -cf - . 2>>"$LOGS/main_src.log" | tar -x -C "$BASE"
main_pid=""
if [ -f "$BASE/Makefile" ]; then
    (cd "$BASE" && exec timeout 100 make -j8 "${MAKEVARS[@]}" BUILD=build build/kdt build/bench/bench_spec) >"$LOGS/build_main.log" 2>&1 &
    main_pid=$!
fi
step build 100 make -j12 "${MAKEVARS[@]}" BUILD=build build/kdt build/tests/test_spec build/bench/bench_spec ||
    tail -20 "$LOGS/build.log" | tee -a "$OUT/summary.txt"
if [ -z "$main_pid" ]; then
    say "SKIP  build_main (no main tree: $(head -c 200 "$LOGS/main_src.log"))"
elif wait "$main_pid"; then
    say "PASS  build_main ($SECONDS s since the start)"
else
    say "FAIL  build_main"
    tail -10 "$LOGS/build_main.log" | tee -a "$OUT/summary.txt"
fi
MAINKDT="$BASE/build/kdt"
[ -x "$MAINKDT" ] || MAINKDT=""

# 2. The loop's tests on the device.
step test_spec 40 build/tests/test_spec
test_counts test_spec

# 3. bench_spec, oracle at batch 1.
bs() { # bs NAME BIN [args]
    local name=$1 bin=$2; shift 2
    [ -x "$bin" ] || return 0
    step "bench_spec_$name" 30 "$bin" --batches 1 --drafters oracle --out "$OUT/bench_spec_$name.md" "$@" &&
        grep -E '^\| 1 \|' "$OUT/bench_spec_$name.md" | sed "s/^/      $name /" | tee -a "$OUT/summary.txt"
}
bs main "$BASE/build/bench/bench_spec"
bs new build/bench/bench_spec
KDT_SPEC_PROFILE=1 bs new_profile build/bench/bench_spec
bs new_nosync build/bench/bench_spec --no-sync

# 4. The phases of a step on new, with the forward's device time (KDT_SPEC_PROFILE=1).
for i in 0 3; do
    ids=$(sed -n "$((i + 1))p" "$MODEL/heldout_prompts.ids" | tr -s ' ' ',' | sed 's/,$//')
    for s in plain 16,1,16 8,2,16; do
        args=()
        [ $s = plain ] || { IFS=, read -r d k n <<<"$s"; args=(--spec lookup --depth "$d" --topk "$k" --budget "$n"); }
        KDT_SPEC_PROFILE=1 step "profile_p${i}_${s//,/_}" 20 build/kdt generate --backend cuda --model "$MODEL" --eos 1 \
            --max-new 256 --prompt-ids "$ids" "${args[@]}" &&
            grep -o 'kdt generate: \(prefill\|profile\|spec\|time per step\).*' "$LOGS/profile_p${i}_${s//,/_}.log" | sed 's/^kdt generate: /      /' |
            tee -a "$OUT/summary.txt"
    done
done

# 5. kdt generate on the held-out prompts, new and main interleaved (scripts/gpu_generate.sh).
gen_prompts build/kdt "$MAINKDT" "$SETTINGS" 25
gen_table "$SETTINGS" "$OUT/spec_step.md"

say "gpu_spec_step: $npass passed, $nfail failed, $nskip skipped in $SECONDS s (table: $OUT/spec_step.md, logs: $LOGS)"
