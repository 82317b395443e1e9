#!/usr/bin/env bash
# Issue 21, the shipped model's decode and verify step (branch sB), beside main built in the same run
# (git archive $MAIN_REF into $BASE, else a copy of $MAIN_DIR, default /work/main; without either the
# main columns are empty and the summary says so). Steps, most
# important first; a step that would pass $DEADLINE (seconds since the start, default 140) is cut or
# skipped and says so:
#   build       this tree and main's, in parallel, sm_90a only;
#   tests       test_model_graph (run to run, graphs and PDL bit for bit, fused vs cuBLAS), test_model_cuda;
#   generate    kdt generate --model models/kdt-small, batch 1, greedy, 256 new tokens, held-out prompts
#               1-4: plain and --spec lookup --depth 8 --topk 2 --budget 16; this tree's default flags,
#               $ALT (default 11: the default without KDT_MODEL_PDL) and main; decode tokens/s, outputs
#               equal to main's plain;
#   bench_model built-in and Kimi dims, batch 1/8/32 (prefill, decode, 16-row verify): new, $ALT, main;
#   bench_argmax tree- vs decode-shaped argmax disagreements on the shipped model (must be 0);
#   ncu         per-kernel times of one decode step and one 16-row verify step (graphs off: flags 9);
#   test_spec   the loop (1-row verifies when nothing is drafted) and its argmax kernel against the host's.
# Every step prints PASS|FAIL|SKIP <step> (exit, seconds), then its figures; logs in $OUT/logs,
# tables in $OUT, the summary in $OUT/summary.txt.
#   OUT=/tmp/out bash scripts/gpu_step.sh
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kdt-step}
LOGS="$OUT/logs"
mkdir -p "$LOGS"
DEADLINE=${DEADLINE:-140}
JOBS=${JOBS:-16}
ALT=${ALT:-11}
MAIN_REF=${MAIN_REF:-main}
BASE=${BASE:-/tmp/kdt-step-main}
MODEL=models/kdt-small
MAKEVARS=(CUDA_ARCH="-gencode arch=compute_90a,code=sm_90a")
source scripts/gpu_deps.sh  # libcjson, PCRE2, libmicrohttpd from .deb/ where missing

npass=0 nfail=0 nskip=0
source scripts/gpu_steps.sh  # say, step, test_counts
: >"$OUT/summary.txt"
say "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>&1 | head -1); commit $(git rev-parse --short HEAD 2>/dev/null || echo '?'); main $(git rev-parse --short "$MAIN_REF" 2>/dev/null || echo '?')"

# 1. Build this tree and main's side by side.
rm -rf "$BASE" && mkdir -p "$BASE"
git archive "$MAIN_REF" 2>"$LOGS/main_src.log" | tar -x -C "$BASE" 2>>"$LOGS/main_src.log"
if [ ! -f "$BASE/Makefile" ] && [ -f "${MAIN_DIR:-/work/main}/Makefile" ]; then  # no git here: a checkout of main's
    tar -C "${MAIN_DIR:-/work/main}" --exclude=.git --exclude='./build*' -cf - . | tar -x -C "$BASE"
fi
if [ -f "$BASE/Makefile" ]; then
    (cd "$BASE" && timeout 110 make -j8 "${MAKEVARS[@]}" BUILD=build build/kdt build/bench/bench_model >"$LOGS/build_main.log" 2>&1)&
    main_pid=$!
else
    say "SKIP  main's tree: git archive $MAIN_REF failed ($(head -c 200 "$LOGS/main_src.log"))"
fi
T=build/tests B=build/bench
step build 110 make -j"$JOBS" "${MAKEVARS[@]}" BUILD=build build/kdt "$T/test_model_graph" "$T/test_model_cuda" "$T/test_spec" \
    "$B/bench_model" "$B/bench_argmax" || tail -20 "$LOGS/build.log" | tee -a "$OUT/summary.txt"
if [ -n "${main_pid:-}" ]; then
    wait "$main_pid" && say "PASS  build_main ($SECONDS s since start)" ||
        { say "FAIL  build_main"; tail -10 "$LOGS/build_main.log" | tee -a "$OUT/summary.txt"; }
fi
MAINKDT="$BASE/build/kdt"
[ -x "$MAINKDT" ] || MAINKDT=""

# 2. Tests of the forward on the H200.
step test_model_graph 30 "$T/test_model_graph"
test_counts test_model_graph
step test_model_cuda 30 "$T/test_model_cuda"
test_counts test_model_cuda

# 3. kdt generate, batch 1, greedy, 256 new tokens, held-out prompts 1-4.
gen() { # gen NAME KDT FLAGS(or "") IDS [spec args]
    local name=$1 kdt=$2 flags=$3 ids=$4; shift 4
    [ -n "$kdt" ] || return 0
    KDT_MODEL_FLAGS=$flags step "$name" 15 "$kdt" generate --model "$MODEL" --backend cuda --prompt-ids "$ids" --max-new 256 "$@"
}
rate() { grep -oE 'decode [0-9]+ tokens in [0-9.]+ s \([0-9.]+ tokens/s\)' "$LOGS/$1.log" 2>/dev/null | grep -oE '[0-9.]+ tokens/s' | cut -d' ' -f1; }
out_of() { grep -v '^kdt generate' "$LOGS/$1.log" 2>/dev/null | md5sum; }
for i in 1 2 3 4; do
    ids=$(sed -n "${i}p" "$MODEL/heldout_prompts.ids" | tr -s ' ' ',' | sed 's/,$//')
    for v in new alt main; do
        kdt=build/kdt flags=""
        [ $v = alt ] && flags=$ALT
        [ $v = main ] && kdt=$MAINKDT
        gen "plain_p${i}_$v" "$kdt" "$flags" "$ids"
        gen "lookup_p${i}_$v" "$kdt" "$flags" "$ids" --spec lookup --depth 8 --topk 2 --budget 16
    done
done
for v in main new alt; do
    pr="" lr="" same=0 eqmain=0
    for i in 1 2 3 4; do
        [ -f "$LOGS/plain_p${i}_$v.log" ] || continue
        pr="$pr $(rate plain_p${i}_$v)" lr="$lr $(rate lookup_p${i}_$v)"
        [ -n "$(rate plain_p${i}_$v)" ] || continue  # the run failed: its output counts for nothing
        [ -n "$(rate lookup_p${i}_$v)" ] && [ "$(out_of plain_p${i}_$v)" = "$(out_of lookup_p${i}_$v)" ] && same=$((same + 1))
        [ -n "$(rate plain_p${i}_main)" ] && [ "$(out_of plain_p${i}_$v)" = "$(out_of plain_p${i}_main)" ] && eqmain=$((eqmain + 1))
    done
    [ $v = alt ] && say "      (alt = KDT_MODEL_FLAGS=$ALT)"
    mp=$(echo $pr | awk '{s=0; for(i=1;i<=NF;i++) s+=$i; if (NF) printf "%.1f", s/NF}')
    ml=$(echo $lr | awk '{s=0; for(i=1;i<=NF;i++) s+=$i; if (NF) printf "%.1f", s/NF}')
    say "INFO  generate $v: plain tokens/s per prompt:$pr (mean ${mp:-?}); lookup D=8 K=2 N=16:$lr (mean ${ml:-?}); lookup = plain on $same; plain = main's plain on $eqmain"
    grep -h 'mean accepted\|time per step' "$LOGS"/lookup_p3_$v.log 2>/dev/null | sed "s/^/      p3 $v: /" | tee -a "$OUT/summary.txt"
done

# 4. bench_model: built-in and Kimi dims (prefill must not get slower).
bm() { # bm NAME BIN FLAGS
    [ -x "$2" ] || return 0
    KDT_MODEL_FLAGS=$3 step "bench_model_$1" 30 "$2" --reps 5 --out "$OUT/bench_model_$1.md" &&
        grep -E '^\| +(1|8|32) \|' "$OUT/bench_model_$1.md" | sed "s/^/      $1 /" | tee -a "$OUT/summary.txt"
}
bm new build/bench/bench_model ""
bm main "$BASE/build/bench/bench_model" ""
say "      columns: B | prefill tokens | prefill ms | prefill tok/s | decode ms | decode tok/s | verify ms | verify rows/s | decode floor ms | x floor | verify floor ms | x floor (built-in model first, then Kimi dims)"

# 5. Tree- against decode-shaped argmax on the shipped model.
step bench_argmax 20 "$B/bench_argmax" --model "$MODEL" --limit 16 --steps 64 --tree 16 --out "$OUT/bench_argmax.md" &&
    say "      $(grep '^total' "$LOGS/bench_argmax.log")"

# 6. ncu: the kernels of one decode step (the third forward of a plain run) and of one 16-row verify
# (a lookup run on a prompt that repeats, D=15 K=1 N=15: every step drafts 15 nodes), graphs off.
ncu_list() { # ncu_list NAME EMBED_GRID(or "") -- kdt args
    local name=$1 grid=$2; shift 3
    KDT_MODEL_FLAGS=9 step "ncu_$name" 30 ncu --csv --clock-control none --metrics gpu__time_duration.sum --launch-count 400 \
        build/kdt generate --model "$MODEL" --backend cuda "$@" || return
    python3 - "$LOGS/ncu_$name.log" "$OUT/ncu_$name.csv" "$grid" "$name" <<'EOF' | tee -a "$OUT/summary.txt"
import csv, sys
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')) if len(r) > 10]
head, rows = rows[0], rows[1:]
name, val, unit, grid = (head.index(k) for k in ("Kernel Name", "Metric Value", "Metric Unit", "Grid Size"))
starts = [i for i, r in enumerate(rows) if "embed_kernel" in r[name]] + [len(rows)]
want = sys.argv[3]
gx = lambda k: int(rows[starts[k]][grid].strip("()").split(",")[0])
picks = [k for k in range(len(starts) - 1) if (rows[starts[k]][grid].replace(" ", "") == want if want else k == 2)]
if not picks and want and len(starts) > 2:  # no exact shape: the largest forward after the prefill
    picks = [max(range(1, len(starts) - 1), key=gx)]
if not picks:
    print(f"      ncu {sys.argv[4]}: no forward with embed grid {want or 'third'} among {len(starts) - 1}"); sys.exit(0)
k = picks[0]
step = rows[starts[k]:starts[k + 1]]
scale = {"ns": 1e-3, "nsecond": 1e-3, "us": 1.0, "usecond": 1.0, "ms": 1e3, "msecond": 1e3}
us = [float(r[val].replace(",", "")) * scale.get(r[unit], 1.0) for r in step]
with open(sys.argv[2], "w") as f:
    w = csv.writer(f); w.writerow(["kernel", "grid", "us"])
    for r, u in zip(step, us): w.writerow([r[name][:120], r[grid], f"{u:.2f}"])
by = {}
for r, u in zip(step, us):
    key = r[name].replace("(anonymous namespace)::", "").removeprefix("void ").split("(")[0][:50]
    n, t = by.get(key, (0, 0.0)); by[key] = (n + 1, t + u)
top = sorted(by.items(), key=lambda t: -t[1][1])[:9]
print(f"      ncu {sys.argv[4]}: forward {k} (embed grid {gx(k)} blocks: rows), {len(step)} kernels, {sum(us):.1f} us (graphs off, caches flushed per kernel); " +
      "; ".join(f"{key} {n}x {t:.1f}" for key, (n, t) in top))
EOF
}
ncu_list decode "" -- --prompt-ids 0,461,2176,20,11,81,332 --max-new 5
ncu_list verify16 "(16,1,1)" -- --prompt-ids 0,5,6,7,8,9,10,11,12,13,5,6,7,8,9,10,11,12,13,5,6,7 --max-new 40 --spec lookup \
    --depth 15 --topk 1 --budget 15

# 7. bench_model with $ALT, then the loop's tests, if time is left.
bm alt build/bench/bench_model "$ALT"

# 8. The loop's tests (bucketed verify rows, the argmax kernel against the host's), if time is left.
step test_spec 30 "$T/test_spec"
test_counts test_spec

say "gpu_step: $npass passed, $nfail failed, $nskip skipped in $SECONDS s (logs: $LOGS)"
