#!/usr/bin/env bash
# Issue 22 (split scheduler, 8-head shapes) and issue 21's attention (the small model's decode calls) on
# a GPU machine (H200), in under 150 s: builds test_verify_attn_fast and bench_verify_attn for sm_90a
# (and, where `git archive main` works here, main's sm90 kernels linked into the same bench as a
# baseline binary); runs the test (every case, randomized against the CPU reference) beside memcheck and
# racecheck of its --quick cases; the bench on the issue's 7 shapes and the small decode / verify
# shapes (--small: 4 heads, a few keys of a 2048-key cache) with the split sweep (chosen vs best forced
# split, GB/s against the copy ceiling) and the baseline split; main's binary on the same shapes; ncu
# (tensor pipe, DRAM throughput, occupancy, L2) on 128,8,9,16384 and on 1,4,1,256; ncu of the seesaw
# experiment beside the shipped kernel (tensor pipe, warp stall reasons).
# One "## " line per step, printed again at the end; logs in $OUT/logs, tables in $OUT.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kdt-verify-attn}
LOGS="$OUT/logs"
mkdir -p "$LOGS"
BUILD=${BUILD:-build}
DEADLINE=${DEADLINE:-145}
source scripts/gpu_notes.sh # note, step

MAKEVARS=(BUILD="$BUILD" CUDA_ARCH="-gencode arch=compute_90a,code=sm_90a")
source scripts/gpu_deps.sh # libcjson, PCRE2, libmicrohttpd from .deb/ where missing
note "gpu: $(nvidia-smi --query-gpu=name,driver_version,clocks.sm --format=csv,noheader 2>&1 | head -1), commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"

T="$BUILD/tests/test_verify_attn_fast" BV="$BUILD/bench/bench_verify_attn" BM="$BUILD/bench/bench_verify_attn_main"
SS="$BUILD/dev/verify_attn_sm90_seesaw"
NVCC=${NVCC:-$(command -v nvcc || echo /usr/local/cuda/bin/nvcc)}
CUDA_HOME=${CUDA_HOME:-$(dirname "$(dirname "$NVCC")")}

# main's sm90 objects (launcher, kernel, combine), for a baseline bench binary; in the background
MAIN=/tmp/kdt-main-sm90
build_main() {
    rm -rf "$MAIN" && mkdir -p "$MAIN/obj" && git archive main include src | tar -x -C "$MAIN" || return 1
    local f pids=()
    for f in "$MAIN"/src/cuda/sm90/*.cu; do
        "$NVCC" -std=c++17 -I"$MAIN/include" -I"$MAIN/src" -DKDT_HAVE_CUDA=1 -Xcompiler -fPIC --expt-relaxed-constexpr -O3 \
            -gencode arch=compute_90a,code=sm_90a -c "$f" -o "$MAIN/obj/$(basename "$f" .cu).o" & pids+=($!)
    done
    for f in "${pids[@]}"; do wait "$f" || return 1; done
}
main_ok=0
if git rev-parse --verify -q main >/dev/null 2>&1; then
    (timeout 80 bash -c "$(declare -f build_main); MAIN=$MAIN NVCC=$NVCC build_main" >"$LOGS/build_main.log" 2>&1; echo $? >"$LOGS/build_main.rc") &
    main_pid=$!
else
    note "main baseline: no git history here (the bench's forced baseline split stands in)"
    main_pid=
fi
step build 80 make -j16 "${MAKEVARS[@]}" "$T" "$BV" "$SS" || tail -30 "$LOGS/build.log"
if [ -n "$main_pid" ]; then
    wait "$main_pid"
    if [ "$(cat "$LOGS/build_main.rc" 2>/dev/null)" = 0 ] && [ -f "$BUILD/obj/bench/bench_verify_attn.o" ]; then
        deps_ld=()
        [ -n "${kdt_deps_lib:-}" ] && deps_ld=(-L"$kdt_deps_lib" -Wl,-rpath,"$kdt_deps_lib")
        cc -o "$BM" "$BUILD/obj/bench/bench_verify_attn.o" "$MAIN"/obj/*.o "$BUILD/libkdt.a" "${deps_ld[@]}" -lm -lpthread -lcjson \
            -lpcre2-8 -L"$CUDA_HOME/lib64" -Wl,-rpath,"$CUDA_HOME/lib64" -lcudart_static -ldl -lrt -lstdc++ >>"$LOGS/build_main.log" 2>&1 &&
            main_ok=1
    fi
    note "main baseline binary (main's src/cuda/sm90 in this bench): $([ $main_ok = 1 ] && echo built || echo "not built, see logs/build_main.log")"
fi

# 1. correctness: the whole test beside memcheck and racecheck of its quick cases (the GPU is not timed here)
if [ -x "$T" ]; then
    (step test_verify_attn_fast 45 "$T" >/dev/null) &
    p1=$!
    (step memcheck 45 compute-sanitizer --tool memcheck --error-exitcode 9 "$T" --quick --kernels 1,0 >/dev/null) &
    p2=$!
    (step racecheck 45 compute-sanitizer --tool racecheck --error-exitcode 9 "$T" --quick --kernels 1 >/dev/null) &
    p3=$!
    wait $p1 $p2 $p3
    L="$LOGS/test_verify_attn_fast.log"
    grep -E '^FAIL' "$L" | head -8
    note "test_verify_attn_fast: $(counts "$L")$(grep -q 'seed' "$L" && echo ", $(grep -o 'seed [0-9]*' "$L" | head -1)")"
    for s in memcheck racecheck; do
        note "$s (--quick): $(grep -hE 'ERROR SUMMARY|RACECHECK SUMMARY' "$LOGS/$s.log" | head -1), test lines $(grep -c '^PASS' "$LOGS/$s.log") PASS $(grep -c '^FAIL' "$LOGS/$s.log") FAIL"
    done
else
    note "test_verify_attn_fast: not built"
fi

# 2. the bench: issue shapes + small shapes, split sweep, baseline split; then main's binary
ab_note() { # $1: log; the A/B table: chosen vs baseline, and back to back
    grep -A 20 '^A/B' "$1" | grep -E '^\| [0-9]' | awk -F'|' '{for (i = 3; i <= 9; i++) gsub(/ /, "", $i); gsub(/^ +| +$/, "", $2); printf "[%s: %sp %s vs %sp %s = %s; b2b %s vs %s] ", $2, $3, $4, $5, $6, $7, $8, $9}'
}
sweep_note() { # $1: log; chosen vs best forced split per shape
    sed -n '/^split sweep/,/^A\/B/p' "$1" | grep -E '^\| [0-9]' | awk -F'|' '{gsub(/ /,"",$2); gsub(/ /,"",$3); gsub(/ /,"",$4); gsub(/ /,"",$7); gsub(/ /,"",$8); gsub(/ /,"",$10); printf "[%s: %s parts %sus, best %s %sus x%s] ", $2, $3, $4, $7, $8, $10}'
}
if [ -x "$BV" ]; then
    step bench 45 "$BV" --small --reps 20 --no-fallback --parts 1,2,3,4,5,6,7,8,12,16,26,32,44,65 \
        --out "$OUT/bench_verify_attn.md" --csv "$OUT/verify_attn.csv"
    B="$LOGS/bench.log"
    note "ceilings: $(grep -m1 '^ceilings' "$B")"
    note "times (us, chosen parts): $(grep -E '^\| [0-9]' "$OUT/bench_verify_attn.md" 2>/dev/null | head -13 | awk -F'|' '{gsub(/ /,"",$2); gsub(/ /,"",$3); gsub(/ /,"",$4); gsub(/ /,"",$10); printf "[%s: %s p, %s us, %s] ", $2, $3, $4, $10}')"
    note "split sweep: $(sweep_note "$B")"
    note "cross-check auto vs cp.async per shape (rel_l2, differing; narrow runs the <= 16-row calls): $(grep -E '^  auto vs cp.async' "$B" | awk '{printf "[%s %s] ", $5, $9}')"
    grep -E '^\| (64, 8|128, 8), ' "$B" | head -2 | while IFS= read -r l; do note "8-head (| shape | parts | us | TFLOP/s | %GEMM | GB/s | %copy |...): $(cut -d'|' -f1-8 <<<"$l")"; done
    note "A/B vs forced baseline split (us; b2b: per call of 20 in one CUDA graph): $(ab_note "$B")"
fi
if [ "$main_ok" = 1 ]; then
    step bench_main 25 "$BM" --small --reps 20 --no-fallback --no-sweep --kernels 1 --out "$OUT/bench_verify_attn_main.md"
    note "main's binary, A/B table (its chosen split vs the same forced; b2b: 20 calls in one CUDA graph, per call): $(ab_note "$LOGS/bench_main.log")"
    # new / main per shape, from the two tables' main columns
    note "new / main (us): $(paste -d'#' <(grep -E '^\| [0-9]' "$OUT/bench_verify_attn.md" | head -13) <(grep -E '^\| [0-9]' "$OUT/bench_verify_attn_main.md" | head -13) |
        awk -F'#' '{split($1, a, "|"); split($2, b, "|"); gsub(/ /, "", a[4]); gsub(/ /, "", b[4]); gsub(/^ +| +$/, "", a[2]); if (b[4] > 0) printf "[%s: %s / %s = %.3f] ", a[2], a[4], b[4], a[4] / b[4]}')"
fi

# 3. ncu: the 8-head bandwidth-bound shape and the small decode shape
avail="" metrics=gpu__time_duration.sum tensor=""
ncu_step() { # NAME LIMIT ARGS...: ncu with $metrics$tensor$extra, again without $tensor if ncu refuses a name
    local name=$1 limit=$2; shift 2
    step "$name" "$limit" ncu --clock-control none --metrics "$metrics$tensor${extra:-}" "$@"
    if grep -q '==ERROR==' "$LOGS/$name.log" && [ -n "$tensor" ]; then
        step "$name" "$limit" ncu --clock-control none --metrics "$metrics${extra:-}" "$@"
    fi
}
if command -v ncu >/dev/null; then
    avail=$(ncu --query-metrics --chip gh100 2>/dev/null | awk '{print $1}')
    for m in sm__pipe_tensor_op_gmma_cycles_active.avg.pct_of_peak_sustained_active dram__throughput.avg.pct_of_peak_sustained_elapsed \
             dram__bytes_read.sum lts__t_bytes.sum lts__t_sector_hit_rate.pct sm__warps_active.avg.pct_of_peak_sustained_active \
             sm__throughput.avg.pct_of_peak_sustained_elapsed; do
        grep -qx "${m%%.*}" <<<"$avail" && metrics+=",$m"
    done
    # the tensor pipe's name differs between ncu versions: whichever sm__pipe_tensor*cycles_active it lists
    tensor=""
    for m in $(sed 's/\..*//' <<<"$avail" | grep -E '^sm__pipe_tensor[a-z_]*cycles_active$' | sort -u | head -3); do
        [[ ",$metrics," == *",$m."* ]] || tensor+=",$m.avg.pct_of_peak_sustained_active"
    done
fi
if command -v ncu >/dev/null && [ -x "$BV" ]; then
    for sh in 6 9; do
        extra="" ncu_step ncu_shape$sh 12 -k 'regex:va_sm90' -c 2 "$BV" --small --shape $sh --reps 1 --no-fallback --no-sweep --kernels 1
        note "ncu shape $sh: $(grep -E 'va_sm90|duration|pct|bytes|hit_rate|tensor' "$LOGS/ncu_shape$sh.log" | awk '/==PROF==/ {next} /va_sm90/ {printf "{%s} ", ($0 ~ /combine/ ? "combine" : "main"); next} {printf "%s=%s %s ", $1, $NF, $(NF-1)}')"
    done
fi

# 4. why the seesaw experiment is slower than the shipped kernel: both on 1,64,33,32768 (its check runs
#    shipped then seesaw), tensor pipe and warp stall reasons per kernel
if command -v ncu >/dev/null && [ -x "$SS" ]; then
    stalls=""
    for r in barrier long_scoreboard wait math_pipe_throttle short_scoreboard membar mio_throttle; do
        m=smsp__warp_issue_stalled_${r}_per_warp_active
        grep -qx "$m" <<<"$avail" && stalls+=",$m.pct"
    done
    extra="$stalls" ncu_step ncu_seesaw 20 -k 'regex:va_sm90_kernel|seesaw_kernel' -c 2 "$SS" --check-only --shape 0
    note "ncu shipped vs seesaw (1,64,33,32768): $(grep -E 'va_sm90_kernel|seesaw_kernel|duration|tensor|stalled|dram__throughput' "$LOGS/ncu_seesaw.log" | awk '/==PROF==/ {next} /va_sm90_kernel|seesaw_kernel/ {printf "{%s} ", ($0 ~ /seesaw/ ? "seesaw" : "shipped"); next} {sub(/smsp__warp_issue_stalled_/, "", $1); sub(/_per_warp_active.pct/, "", $1); printf "%s=%s ", $1, $NF}')"
fi

echo
echo "==== summary ($SECONDS s) ===="
printf '%s\n' "${summary[@]}" | tee "$OUT/summary.txt"
