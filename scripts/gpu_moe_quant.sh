#!/usr/bin/env bash
# Issue 23, the grouped quantized-expert kernels (src/model/cuda/moe_quant.cu), on a GPU machine in
# under 170 s: builds (sm_90a) this tree and, beside it, the baseline (main from git where git has
# it, else this tree without moe.cu's two dispatch lines to moe_quant; either way with this tree's
# bench_model_quant.cu, so only the library differs); runs test_moe_quant (the kernels against the
# CPU); dev/cuda/moe_quant_bench (one layer's routed experts at R = 1, 8, 32: main's kernel, the
# library's and other splits / depths, against the copy ceiling); bench_model_quant (K2.6 layout,
# INT4 experts) at batch 1, 8, 32 for both builds; ncu's per-kernel time and DRAM bytes of one batch-1
# decode step (graphs off); test_quant_cuda (FP8 and K2.6-INT4 fixtures through the forward) and
# test_quant_gemm (quant_gemm, kdt_sgemm: every cfg against the CPU); then, if
# time is left, ncu on the baseline, the DeepSeek-V3 FP8 layout for both, ncu of the FP8 kernels and the
# dev bench's --exp rows (an INT4 experiment the library does not launch). Logs in $OUT/logs,
# tables in $OUT; one "## " line per step, the summary last. No network: see scripts/gpu_deps.sh.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kdt-moe-quant}
LOGS="$OUT/logs"
mkdir -p "$LOGS"
BUILD=${BUILD:-build}
DEADLINE=${DEADLINE:-160}  # SCRIPT_BUDGET 170 s
GB=${GB:-110}           # bench_model_quant --gb, K2.6 INT4: 12 layers (dense + 11 MoE), as docs/perf/quant.md's 8.0 ms run
GB_FP8=${GB_FP8:-24}    # DeepSeek-V3 FP8: 2 layers
source scripts/gpu_notes.sh  # note, step

MAKEVARS=(BUILD="$BUILD" CUDA_ARCH="-gencode arch=compute_90a,code=sm_90a")
source scripts/gpu_deps.sh
note "gpu: $(nvidia-smi --query-gpu=name,driver_version,clocks.max.sm --format=csv,noheader 2>&1 | head -1)"

# The baseline tree.
BASE=/tmp/kdt-moe-quant-base
rm -rf "$BASE" && mkdir -p "$BASE"
if git rev-parse -q --verify main >/dev/null 2>&1 && git archive main | tar -x -C "$BASE"; then
    base_from="main $(git rev-parse --short main)"
else
    tar -cf - --exclude=./.git --exclude="./$BUILD" . | tar -xf - -C "$BASE"
    rm -f "$BASE/src/model/cuda/moe_quant.cu"
    sed -i '/kdt_moe_quant/d' "$BASE/src/model/cuda/moe.cu"
    base_from="this tree without moe_quant"
fi
cp bench/bench_model_quant.cu bench/bench_common.h "$BASE/bench/"
note "baseline: $base_from"

T="$BUILD/tests" B="$BUILD/bench/bench_model_quant" BB="$BASE/$BUILD/bench/bench_model_quant"
(cd "$BASE" && timeout 90 make -j16 "${MAKEVARS[@]}" "$BUILD/bench/bench_model_quant" >"$LOGS/build_base.log" 2>&1) &
base_pid=$!
step build 100 make -j16 "${MAKEVARS[@]}" "$T/test_moe_quant" "$T/test_quant_cuda" "$T/test_quant_gemm" "$B" "$BUILD/dev/moe_quant_bench" ||
    grep -E 'error' "$LOGS/build.log" | head -20
wait "$base_pid"
note "build_base: exit $? ($LOGS/build_base.log)"

tests() { # tests NAME LIMIT: runs $T/NAME, notes its PASS / FAIL / SKIP counts
    [ -x "$T/$1" ] || { note "$1: FAIL (not built)"; return; }
    step "$1" "$2" "$T/$1"
    local rc=$? p f s
    p=$(grep -c '^PASS' "$LOGS/$1.log"); f=$(grep -c '^FAIL' "$LOGS/$1.log"); s=$(grep -c '^SKIP' "$LOGS/$1.log")
    grep -E '^FAIL ' "$LOGS/$1.log" | head -10
    note "$1: $([ "$rc" = 0 ] && [ "$f" = 0 ] && [ "$p" -gt 0 ] && echo PASS || echo FAIL) ($p passed, $f failed, $s skipped, exit $rc)"
}
tests test_moe_quant 30

# One MoE layer's routed experts (dev/cuda/moe_quant_bench.cu): main's kernel, the library's, variants.
if [ -x "$BUILD/dev/moe_quant_bench" ]; then
    step moe_quant_bench 30 "$BUILD/dev/moe_quant_bench" --out "$OUT/moe_quant_bench.md" --reps 16
    awk -F'|' '/^\| (int4|fp8) \|/ { gsub(/^ +| +$/, "", $4); printf "%s R=%s %s: %s us, %s of copy, ye vs main %s\n", $2, $3, $4, $7, $12, $13 }' \
        "$OUT/moe_quant_bench.md" | tr -s ' ' >"$OUT/moe_quant_bench.txt"
    while read -r l; do note "$l"; done <"$OUT/moe_quant_bench.txt"
else note "moe_quant_bench: FAIL (not built)"; fi

bench() { # bench NAME BIN ARGS...: bench_model_quant's rows "| B | ms | tok/s | floor GB | floor ms | x floor |..."
    local name=$1 bin=$2; shift 2
    [ -x "$bin" ] || { note "$name: FAIL (not built)"; return; }
    step "$name" 40 "$bin" --out "$OUT/$name.md" "$@"
    note "$name: $(awk -F'|' '/^\| (1|8|32) \|/ { gsub(/ /, ""); printf "B=%s %s ms (%sx floor); ", $2, $3, $7 }' "$OUT/$name.md" 2>/dev/null)"
}
bench bmq_int4_new "$B" --only int4 --gb "$GB" --decode 16
bench bmq_int4_base "$BB" --only int4 --gb "$GB" --decode 16

# ncu: one batch-1 decode step (graphs off; the bench profiles its timed steps alone), per kernel.
ncu_step() { # ncu_step NAME BIN
    command -v ncu >/dev/null || { note "$1: skipped, no ncu"; return; }
    [ -x "$2" ] || { note "$1: FAIL (not built)"; return; }
    KDT_MODEL_FLAGS=9 step "$1" 40 ncu --profile-from-start off --clock-control none --cache-control none --csv \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum "$2" --only int4 --gb 12 --decode 1 --batch 1
    python3 - "$LOGS/$1.log" "$OUT/$1.csv" "$1" >"$OUT/$1.txt" 2>&1 <<'EOF'
import csv, re, sys
rows = [r for r in csv.reader(l for l in open(sys.argv[1]) if l.startswith('"')) if len(r) > 10]
if len(rows) < 2: print(f"{sys.argv[3]}: no ncu rows"); sys.exit(0)
h = rows[0]; iid, kn, mn, mu, mv = (h.index(c) for c in ("ID", "Kernel Name", "Metric Name", "Metric Unit", "Metric Value"))
scale = {"ns": 1e-3, "us": 1, "ms": 1e3, "nsecond": 1e-3, "usecond": 1, "msecond": 1e3, "byte": 1, "Kbyte": 1e3, "Mbyte": 1e6, "Gbyte": 1e9, "KB": 1e3, "MB": 1e6, "GB": 1e9}
ks = {}
for r in rows[1:]:
    k = ks.setdefault(r[iid], {"name": r[kn], "us": 0.0, "bytes": 0.0})
    v = float(r[mv].replace(",", "")) * scale.get(r[mu], 1)
    if r[mn].startswith("gpu__time"): k["us"] = v
    else: k["bytes"] = v
def short(n): return re.sub(r"\(.*", "", n).replace("(anonymous namespace)::", "").replace("<unnamed>::", "")[:90]
def part(n):
    n = n.lower()
    return ("routed experts" if "moe_quant" in n or "moe_small" in n else "attention" if "verify_attn" in n or "va_" in n
            else "GEMM (cuBLAS)" if re.search(r"gemm|nvjet|xmma|cutlass|sm90_", n) else "other")
parts = {}
with open(sys.argv[2], "w") as f:
    w = csv.writer(f); w.writerow(["kernel", "us", "MB read", "GB/s"])
    for k in ks.values():
        w.writerow([short(k["name"]), f'{k["us"]:.1f}', f'{k["bytes"] / 1e6:.2f}', f'{k["bytes"] / max(k["us"], 1e-9) / 1e3:.0f}'])
        p = parts.setdefault(part(k["name"]), [0, 0.0, 0.0]); p[0] += 1; p[1] += k["us"]; p[2] += k["bytes"]
tot = sum(k["us"] for k in ks.values()); byt = sum(k["bytes"] for k in ks.values())
print(f"{sys.argv[3]}: {len(ks)} kernels, {tot:.1f} us, {byt / 1e9:.3f} GB read ({byt / max(tot, 1e-9) / 1e3:.0f} GB/s)")
top = sorted(ks.values(), key=lambda k: -k["us"])[:6]
print(f"{sys.argv[3]}:   top: " + "; ".join(f'{short(k["name"])[:50]} {k["us"]:.1f} us {k["bytes"] / 1e6:.0f} MB' for k in top))
for n, (c, us, b) in sorted(parts.items(), key=lambda t: -t[1][1]):
    print(f"{sys.argv[3]}:   {n}: {c} kernels, {us:.1f} us, {b / 1e9:.3f} GB, {b / max(us, 1e-9) / 1e3:.0f} GB/s")
EOF
    while read -r l; do note "$l"; done <"$OUT/$1.txt"
}
ncu_step ncu_new "$B"

# ncu on the grouped kernels alone (the dev bench's first K2.6 INT4 call at R = 1: gate/up, down):
# occupancy, issue and warp-state statistics.
# ncu_moe: the library's (its first call, after main's kernel); ncu_moe_transpose: the "transpose" variant
# (16-byte loads and the quad's shuffles), past the library's and its own-kernel row's 4 calls each (--reps 1:
# one check, two warm-ups, one timed) of 2 launches.
ncu_moe() { # ncu_moe NAME SKIP [FORMAT]
    command -v ncu >/dev/null && [ -x "$BUILD/dev/moe_quant_bench" ] || return
    step "$1" 30 ncu --clock-control none --cache-control none -k regex:moe_quant_kernel --launch-skip "$2" -c 2 --section Occupancy \
        --section SchedulerStats --section WarpStateStats --section MemoryWorkloadAnalysis --metrics dram__bytes_read.sum,smsp__inst_executed.sum \
        "$BUILD/dev/moe_quant_bench" --only "${3:-int4}" --reps 1
    grep -E 'moe_quant_kernel|Achieved Occupancy|Issue Slots Busy|No Eligible|Warp Cycles Per Issued|Memory Throughput|Registers Per|dram__bytes_read|inst_executed' \
        "$LOGS/$1.log" | sed -E 's/ +/ /g' | cut -c1-150 >"$OUT/$1.txt"
    while read -r l; do note "$1: $l"; done <"$OUT/$1.txt"
}
ncu_moe ncu_moe 0
tests test_quant_cuda 40
tests test_quant_gemm 30  # quant_gemm and kdt_sgemm on quant_mma.cuh's int4 step, stream_gemm.cuh's cfgs
ncu_step ncu_base "$BB"

ncu_moe ncu_moe_transpose 16
bench bmq_fp8_new "$B" --only fp8 --gb "$GB_FP8" --decode 8
bench bmq_fp8_base "$BB" --only fp8 --gb "$GB_FP8" --decode 8
ncu_moe ncu_moe_fp8 0 fp8

# An experiment the library does not launch (moe_quant.cu's kSmem: INT4's ring of steps in shared memory),
# beside the library's kernels, in a process of its own.
if [ -x "$BUILD/dev/moe_quant_bench" ]; then
    step moe_quant_bench_exp 20 "$BUILD/dev/moe_quant_bench" --only int4 --exp --out "$OUT/moe_quant_bench_exp.md" --reps 16
    awk -F'|' '/^\| int4 \|/ { gsub(/^ +| +$/, "", $4); printf "exp %s R=%s %s: %s us (gate/up %s, down %s), %s of copy, ye vs main %s\n", $2, $3, $4, $7, $5, $6, $12, $13 }' \
        "$OUT/moe_quant_bench_exp.md" 2>/dev/null | tr -s ' ' >"$OUT/moe_quant_bench_exp.txt"
    while read -r l; do note "$l"; done <"$OUT/moe_quant_bench_exp.txt"
fi

echo
echo "== summary (logs in $LOGS, tables in $OUT)"
printf '%s\n' "${summary[@]}"
