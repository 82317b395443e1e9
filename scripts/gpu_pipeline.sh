#!/usr/bin/env bash
# Issue 21 (branch pl): plain greedy decoding pipelined (src/spec/decode.c: the argmax inside the
# forward's graph, the next step queued before the host reads this one's token), beside main built in
# the same run. SCRIPT_BUDGET 90 s; every step is cut to what is left before $DEADLINE (seconds since
# the start, default 88). Steps:
#   build           this tree's kdt, test_spec_pipe and the CUPTI tracer; main's kdt alongside
#                   ($BASE_BUILD/kdt when that exists, else `git archive $MAIN_REF` built in $BASE);
#   test_spec_pipe  the pipelined loop on the device: equal to the unpipelined loop and to greedy through
#                   the model API, eos at the first token, at max_new and at a cache block's edge, a
#                   session whose requests join and leave, KDT_SPEC_PROFILE;
#   profile_*       KDT_SPEC_PROFILE=1 on prompt 1, plain and lookup: the forwards' device time a step
#                   (unpipelined), first sights and captures;
#   generate        kdt generate --backend cuda --model models/kdt-small --eos 1 --max-new 256 on the 8
#                   held-out prompts, plain and --spec lookup --depth 16 --topk 1 --budget 16, new and
#                   main interleaved (scripts/gpu_generate.sh): tokens/s, outputs equal;
#   ab              KDT_SPEC_PIPELINE=1 / 0 (this build pipelined or not), interleaved, prompts 0 and 3;
#                   lookup's warm step (cold forwards taken out, KDT_SPEC_PROFILE), new and main;
#   trace           in what is left (11 s kept with trace_lookup): this tree's plain timeline (scripts/gpu_trace.sh's CUPTI trace,
#                   held-out prompt 1, 128 tokens) summarised by bench/trace_steps.py;
#   trace_lookup    in what is left: the lookup run's cold forwards (over 3x the median period) and
#                   the host calls they spend their time in (graph capture, instantiation, module loads).
# Prints PASS|FAIL|SKIP <step> (exit, s) per step and INFO lines with the figures; the table in
# $OUT/pipeline.md, the trace summary in $OUT/trace_plain_new.md, logs in $OUT/logs, the summary in
# $OUT/summary.txt.   OUT=/tmp/out bash scripts/gpu_pipeline.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kdt-pipeline}
LOGS="$OUT/logs"
mkdir -p "$LOGS"
: >"$OUT/summary.txt"
npass=0 nfail=0 nskip=0
source scripts/gpu_steps.sh     # say, step, test_counts
source scripts/gpu_generate.sh  # gen_prompts, gen_table
DEADLINE=${DEADLINE:-88}
MODEL=models/kdt-small
MAIN_REF=${MAIN_REF:-main}
BASE=${BASE:-/tmp/kdt-pipeline-main}
MAKEVARS=(CUDA_ARCH="-gencode arch=compute_90a,code=sm_90a")
source scripts/gpu_deps.sh  # libcjson, PCRE2, libmicrohttpd from .deb/ where missing
say "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1); this tree $(git rev-parse --short HEAD 2>/dev/null || echo '?'), main $(git rev-parse --short "$MAIN_REF" 2>/dev/null || echo '?')"

# 1. Builds: main's kdt (unless $BASE_BUILD has one) beside this tree's.
MAINKDT=""
main_pid=""
if [ -n "${BASE_BUILD:-}" ] && [ -x "$BASE_BUILD/kdt" ]; then
    MAINKDT=$BASE_BUILD/kdt
    say "INFO  main: $MAINKDT (BASE_BUILD)"
else
    rm -rf "$BASE" && mkdir -p "$BASE"
    { git archive "$MAIN_REF" | tar -x -C "$BASE"; } 2>"$LOGS/main_src.log"
    if [ -f "$BASE/Makefile" ]; then
        (cd "$BASE" && exec timeout 70 make -j8 "${MAKEVARS[@]}" BUILD=build build/kdt) >"$LOGS/build_main.log" 2>&1 &
        main_pid=$!
    fi
fi
step build 70 make -j12 "${MAKEVARS[@]}" BUILD=build build/kdt build/tests/test_spec_pipe build/dev/libkdt_trace.so ||
    tail -20 "$LOGS/build.log" | tee -a "$OUT/summary.txt"
if [ -n "$main_pid" ]; then
    if wait "$main_pid"; then say "PASS  build_main ($SECONDS s since the start)"; else say "FAIL  build_main"; tail -10 "$LOGS/build_main.log" | tee -a "$OUT/summary.txt"; fi
    [ -x "$BASE/build/kdt" ] && MAINKDT=$BASE/build/kdt
elif [ -z "$MAINKDT" ]; then
    say "SKIP  build_main (no main tree: $(head -c 200 "$LOGS/main_src.log" 2>/dev/null))"
fi

# 2. The pipelined loop's tests on the device.
if [ -x build/tests/test_spec_pipe ]; then
    step test_spec_pipe 20 build/tests/test_spec_pipe
    test_counts test_spec_pipe
fi

# 3. Where a step's time goes (KDT_SPEC_PROFILE: CUDA events around each forward, the loop then
# unpipelined): the forward's device time a plain step, the floor a pipelined step approaches; a lookup
# step's forwards of one row and of 17, and the forwards that were first sights or captures.
ids=$(sed -n 1p "$MODEL/heldout_prompts.ids" | tr -s ' ' ',' | sed 's/,$//')
for run in plain lookup; do
    args=()
    [ $run = lookup ] && args=(--spec lookup --depth 16 --topk 1 --budget 16)
    KDT_SPEC_PROFILE=1 step "profile_$run" 15 build/kdt generate --backend cuda --model "$MODEL" --eos 1 --max-new 256 \
        --prompt-ids "$ids" "${args[@]}" &&
        grep -o 'decode [0-9]* tokens.*\|profile: .*\|time per step.*' "$LOGS/profile_$run.log" | sed "s/^/      $run /" |
        tee -a "$OUT/summary.txt"
done

# 4. Plain and lookup, new and main interleaved; 16 s kept for the A/B and the traces.
gen_prompts build/kdt "$MAINKDT" "16,1,16" 16
gen_table "16,1,16" "$OUT/pipeline.md"

# 5. This build pipelined and not (KDT_SPEC_PIPELINE=0), interleaved on prompts 0 and 3 (both run 255
# tokens): the pipelining's own share, whatever else the tree changes. Then lookup's warm step, new and
# main (KDT_SPEC_PROFILE; the forwards that were first sights or captures taken out: their cost varies by
# milliseconds run to run, which decides a 256-token lookup run's rate more than the steps do).
for i in 0 3; do
    pids=$(sed -n "$((i + 1))p" "$MODEL/heldout_prompts.ids" | tr -s ' ' ',' | sed 's/,$//')
    for pipe in 1 0; do
        [ $((DEADLINE - SECONDS)) -gt 11 ] || break
        r=$(KDT_SPEC_PIPELINE=$pipe timeout 10 build/kdt generate --backend cuda --model "$MODEL" --eos 1 --max-new 256 \
            --prompt-ids "$pids" 2>&1 >/dev/null | grep -o 'decode [0-9]* tokens in [0-9.]* s ([0-9.]* tokens/s)')
        say "INFO  ab p$i KDT_SPEC_PIPELINE=$pipe: ${r:-failed}"
    done
    for v in new main; do
        kdt=build/kdt
        [ $v = main ] && kdt=$MAINKDT
        [ -x "$kdt" ] && [ $((DEADLINE - SECONDS)) -gt 11 ] || continue
        KDT_SPEC_PROFILE=1 timeout 10 "$kdt" generate --backend cuda --model "$MODEL" --eos 1 --max-new 256 --prompt-ids "$pids" \
            --spec lookup --depth 16 --topk 1 --budget 16 2>&1 >/dev/null | python3 -c '
import re, sys
t = sys.stdin.read()
m = re.search(r"profile: (\d+) steps, ([0-9.]+) us a step", t)
c = re.search(r"(\d+) step forwards not replayed \(first sights, captures\) took ([0-9.]+) ms", t)
if not m or not c:
    sys.exit(print("failed: no profile lines"))
n, us, k, ms = int(m[1]), float(m[2]), int(c[1]), float(c[2])
print(f"{n} steps, {us:.1f} us a step; {k} cold forwards {ms:.2f} ms; warm step {(n * us - 1e3 * ms) / max(n - k, 1):.1f} us")
' | sed "s/^/INFO  lookup p$i $v: /" | tee -a "$OUT/summary.txt"
    done
done

# 6. This tree's plain timeline (prompt 1, 128 tokens), in what is left.
left=$((DEADLINE - SECONDS - 3))
if [ "$left" -lt 3 ] || [ ! -f build/dev/libkdt_trace.so ] || [ ! -x build/kdt ]; then
    say "SKIP  trace (${left}s left, or no tracer)"
elif CUDA_INJECTION64_PATH=$PWD/build/dev/libkdt_trace.so KDT_TRACE_OUT="$OUT/trace_plain_new.json" timeout "$left" \
        build/kdt generate --model "$MODEL" --backend cuda --prompt-ids "$ids" --max-new 128 >"$LOGS/trace.log" 2>&1; then
    say "PASS  trace ($SECONDS s since the start)"
    grep -oE 'decode [0-9]+ tokens in [0-9.]+ s \([0-9.]+ tokens/s\)' "$LOGS/trace.log" | sed 's/^/      traced: /' | tee -a "$OUT/summary.txt"
    timeout 10 python3 bench/trace_steps.py "$OUT/trace_plain_new.json" --label plain_new --skip 8 --out "$OUT/trace_plain_new.md" \
        --slice "$OUT/trace_plain_new_slice.json" >"$LOGS/trace_summary.log" 2>&1 &&
        say "      $(sed -n 3p "$OUT/trace_plain_new.md")" || say "FAIL  trace_summary: $(tail -2 "$LOGS/trace_summary.log")"
else
    say "FAIL  trace (exit $?)"
fi
rm -f "$OUT/trace_plain_new.json"  # the full trace is large; the slice and the summary stay

# 7. Where a lookup run's cold forwards (first sights, captures) spend their time, in what is left.
left=$((DEADLINE - SECONDS - 2))
if [ "$left" -ge 3 ] && [ -f build/dev/libkdt_trace.so ] &&
    CUDA_INJECTION64_PATH=$PWD/build/dev/libkdt_trace.so KDT_TRACE_OUT="$OUT/trace_lookup_new.json" timeout "$left" \
        build/kdt generate --model "$MODEL" --backend cuda --prompt-ids "$ids" --max-new 128 --spec lookup --depth 16 \
        --topk 1 --budget 16 >"$LOGS/trace_lookup.log" 2>&1; then
    timeout 5 python3 - "$OUT/trace_lookup_new.json" <<'EOF' 2>&1 | tee -a "$OUT/summary.txt"
import json, statistics, sys
ev = [e for e in json.load(open(sys.argv[1])).get("traceEvents", []) if e.get("ph") == "X"]
gpu = sorted((e for e in ev if e["pid"] == 0 and e.get("cat") in ("kernel", "memcpy", "memset")), key=lambda e: e["ts"])
host = [e for e in ev if e["pid"] == 1]
starts = [e["ts"] for e in gpu if e.get("cat") == "kernel" and "embed_kernel" in e["name"]]
steps = [(i, a, b, sum(a <= e["ts"] < b and e["cat"] == "kernel" for e in gpu)) for i, (a, b) in enumerate(zip(starts, starts[1:]))]
med = statistics.median(b - a for _, a, b, _ in steps) if steps else 0
cold = [s for s in steps if s[2] - s[1] > 3 * med]
print(f"INFO  lookup trace: {len(steps)} forwards, median period {med:.1f} us; {len(cold)} over 3x that, "
      f"{sum(b - a for _, a, b, _ in cold) / 1e3:.2f} ms in all (forward 0: the prefill)")
for i, a, b, k in cold[:8]:
    api = {}
    for e in host:
        if a <= e["ts"] < b:
            api[e["name"]] = api.get(e["name"], 0.0) + e["dur"]
    top = sorted(api.items(), key=lambda t: -t[1])[:4]
    print(f"      forward {i}: {(b - a) / 1e3:.2f} ms, {k} kernels; host: " + ", ".join(f"{n} {d / 1e3:.2f} ms" for n, d in top))
EOF
else
    say "SKIP  trace_lookup (${left}s left, or it failed)"
fi
rm -f "$OUT/trace_lookup_new.json"
say "gpu_pipeline: $npass passed, $nfail failed, $nskip skipped in $SECONDS s (table: $OUT/pipeline.md, logs: $LOGS)"
