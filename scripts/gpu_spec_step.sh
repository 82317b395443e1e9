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

# 5. kdt generate on the held-out prompts, new and main interleaved.
gen() { # gen NAME KDT IDS [args]: stdout (the ids) to gen/NAME.out, stderr to gen/NAME.err
    local name=$1 kdt=$2 ids=$3; shift 3
    [ -x "$kdt" ] || return 0
    [ $((DEADLINE - SECONDS)) -gt 25 ] || return 0
    timeout 20 "$kdt" generate --backend cuda --model "$MODEL" --eos 1 --max-new 256 --prompt-ids "$ids" "$@" \
        >"$LOGS/gen/$name.out" 2>"$LOGS/gen/$name.err" || echo "exit $? $name" >>"$LOGS/gen/failed.txt"
}
t0=$SECONDS
for i in 0 1 2 3 4 5 6 7; do
    ids=$(sed -n "$((i + 1))p" "$MODEL/heldout_prompts.ids" | tr -s ' ' ',' | sed 's/,$//')
    for v in new main; do
        kdt=build/kdt
        [ $v = main ] && kdt=$MAINKDT
        gen "plain_p${i}_$v" "$kdt" "$ids"
        for s in $SETTINGS; do
            IFS=, read -r d k n <<<"$s"
            gen "lookup${d}_${k}_${n}_p${i}_$v" "$kdt" "$ids" --spec lookup --depth "$d" --topk "$k" --budget "$n"
        done
    done
done
say "INFO  generate: $(ls "$LOGS/gen" | grep -c '\.err$') runs in $((SECONDS - t0)) s; failed: $(cat "$LOGS/gen/failed.txt" 2>/dev/null | wc -l)"
python3 - "$LOGS/gen" "$OUT/spec_step.md" "$SETTINGS" <<'EOF' | tee -a "$OUT/summary.txt"
import os, re, sys
d, out, settings = sys.argv[1], sys.argv[2], sys.argv[3].split()
runs = ["plain"] + ["lookup" + s.replace(",", "_") for s in settings]
def get(name):
    try:
        err, ids = open(f"{d}/{name}.err").read(), open(f"{d}/{name}.out").read()
    except OSError:
        return None
    m = re.search(r"decode (\d+) tokens in ([0-9.]+) s", err)
    a = re.search(r"mean accepted length ([0-9.]+)", err)
    return (int(m.group(1)), float(m.group(2)), ids, float(a.group(1)) if a else 0.0) if m else None
rows, rate = [], {}
builds = [v for v in ("new", "main") if get(f"plain_p0_{v}")]
done = [i for i in range(8) if all(get(f"{r}_p{i}_{v}") for r in runs for v in builds)]  # prompts every run finished
print(f"INFO  generate: prompts with every run of {' and '.join(builds) or 'no build'}: {done}")
for v in ("new", "main"):
    for r in runs:
        tok = t = acc = 0; n = same = same_main = 0
        for i in done:
            g, p, pm = get(f"{r}_p{i}_{v}"), get(f"plain_p{i}_{v}"), get(f"plain_p{i}_main")
            if not g or not p:
                continue
            n += 1; tok += g[0]; t += g[1]; acc += g[3]
            same += g[2] == p[2]; same_main += bool(pm) and g[2] == pm[2]
        rate[v, r] = tok / t if t > 0 else 0.0
        rows.append((v, r, n, tok, t, same, same_main, acc / max(n, 1)))
lines = ["| build | run | prompts | tokens | decode s | tokens/s | x own plain | new / main | = own plain | = main plain | mean accepted (per prompt) |",
         "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
for v, r, n, tok, t, same, same_main, acc in rows:
    x = rate[v, r] / rate[v, "plain"] if rate[v, "plain"] else 0
    nm = f"{rate['new', r] / rate['main', r]:.2f}" if v == "new" and rate.get(("main", r)) else "-"
    lines.append(f"| {v} | {r} | {n} | {tok} | {t:.3f} | {rate[v, r]:.1f} | {x:.2f}x | {nm} | {same}/{n} | {same_main}/{n} | {acc:.2f} |")
for v in ("new", "main"):  # per prompt: lookup tokens/s over plain's, prompts that run past their first token
    for r in runs[1:]:
        xs = []
        for i in range(8):
            g, p = get(f"{r}_p{i}_{v}"), get(f"plain_p{i}_{v}")
            if g and p and g[1] > 0 and p[1] > 0:
                xs.append(f"p{i} {(g[0] / g[1]) / (p[0] / p[1]):.2f}x (acc {g[3]:.2f})")
        lines.append(f"\n{v} {r} per prompt: " + ", ".join(xs))
open(out, "w").write("\n".join(lines) + "\n")
print("\n".join("      " + l for l in lines))
best = max((rate["new", r] / rate["new", "plain"], r) for r in runs[1:]) if rate.get(("new", "plain")) else (0, "?")
eq = all(same == n for v, r, n, tok, t, same, same_main, acc in rows) and all(row[2] > 0 for row in rows if row[0] == "new")
print(f"{'PASS' if eq else 'FAIL'}  outputs: every run ran and equals its build's plain greedy output")
print(f"INFO  generate: best new lookup {best[1]} {best[0]:.2f}x new plain ({rate.get(('new', 'plain'), 0):.1f} tokens/s; main plain {rate.get(('main', 'plain'), 0):.1f})")
EOF

say "gpu_spec_step: $npass passed, $nfail failed, $nskip skipped in $SECONDS s (table: $OUT/spec_step.md, logs: $LOGS)"
