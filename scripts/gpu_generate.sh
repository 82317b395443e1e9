# Sourced by scripts/gpu_spec_step.sh and gpu_pipeline.sh (after gpu_steps.sh; MODEL, LOGS, OUT, DEADLINE set):
# `kdt generate --backend cuda --model $MODEL --eos 1 --max-new 256` on the 8 held-out prompts (as
# bench/llamacpp/run.sh), plain and `--spec lookup` at each D,K,N of SETTINGS, two builds interleaved
# prompt by prompt.
#   gen_prompts NEW_KDT MAIN_KDT "SETTINGS" RESERVE  runs until RESERVE s before DEADLINE (a missing
#                                                   binary is left out); ids and stderr in $LOGS/gen
#   gen_table "SETTINGS" TABLE                       tokens/s = tokens over summed decode times, on
#                                                   the prompts every run finished; every output must
#                                                   equal its build's plain one (and main's plain);
#                                                   the table to TABLE, the summary lines to stdout
gen() { # gen NAME KDT IDS RESERVE [args]: stdout (the ids) to gen/NAME.out, stderr to gen/NAME.err
    local name=$1 kdt=$2 ids=$3 reserve=$4; shift 4
    [ -x "$kdt" ] || return 0
    [ $((DEADLINE - SECONDS)) -gt "$reserve" ] || return 0
    timeout 20 "$kdt" generate --backend cuda --model "$MODEL" --eos 1 --max-new 256 --prompt-ids "$ids" "$@" \
        >"$LOGS/gen/$name.out" 2>"$LOGS/gen/$name.err" || echo "exit $? $name" >>"$LOGS/gen/failed.txt"
}
gen_prompts() {
    local newkdt=$1 mainkdt=$2 settings=$3 reserve=$4 t0=$SECONDS i v kdt s d k n ids
    mkdir -p "$LOGS/gen"
    for i in 0 1 2 3 4 5 6 7; do
        ids=$(sed -n "$((i + 1))p" "$MODEL/heldout_prompts.ids" | tr -s ' ' ',' | sed 's/,$//')
        for v in new main; do
            kdt=$newkdt
            [ $v = main ] && kdt=$mainkdt
            gen "plain_p${i}_$v" "$kdt" "$ids" "$reserve"
            for s in $settings; do
                IFS=, read -r d k n <<<"$s"
                gen "lookup${d}_${k}_${n}_p${i}_$v" "$kdt" "$ids" "$reserve" --spec lookup --depth "$d" --topk "$k" --budget "$n"
            done
        done
    done
    say "INFO  generate: $(ls "$LOGS/gen" | grep -c '\.err$') runs in $((SECONDS - t0)) s; failed: $(cat "$LOGS/gen/failed.txt" 2>/dev/null | wc -l)"
}
gen_table() {
    python3 - "$LOGS/gen" "$2" "$1" <<'EOF' | tee -a "$OUT/summary.txt"
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
pm = [r for r in rows if r[0] == "new" and r[1] == "plain"]
if pm and rate.get(("main", "plain")):
    print(f"{'PASS' if pm[0][6] == pm[0][2] else 'FAIL'}  outputs: new plain equals main plain on {pm[0][6]}/{pm[0][2]} prompts")
print(f"INFO  generate: best new lookup {best[1]} {best[0]:.2f}x new plain ({rate.get(('new', 'plain'), 0):.1f} tokens/s; main plain {rate.get(('main', 'plain'), 0):.1f})")
EOF
}
