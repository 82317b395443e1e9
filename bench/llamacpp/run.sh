#!/usr/bin/env bash
# llama.cpp beside this engine on the shipped model, in one GPU run (issue 21): the first 8 held-out
# prompts of models/kdt-small (heldout_prompts.jsonl as text for llama.cpp, heldout_prompts.ids for
# kdt), batch 1, greedy, 96 and 256 new tokens; plain decoding, n-gram lookup and the draft model
# models/kdt-small-draft in both engines.
#   OUT=/tmp/out bash bench/llamacpp/run.sh [.gpu/llama.tgz]
# The tarball is prepare.sh's: llama.cpp's converter and either its built CUDA tools (llama/bin,
# llama/lib) or its trimmed source (llama/src), which is then built here with 16 jobs into
# $LLAMA_BUILD (default build-llamacpp/, kept while the machine stays warm) and packed into
# $OUT/llama-bin.tar.xz, a tarball of the first kind to carry next time. The GGUFs are converted here
# with llama.cpp's own converter (bench/llamacpp/convert.py); build/kdt is built when absent.
# Every step prints one line, PASS|FAIL|SKIP <step> (...) (scripts/gpu_steps.sh); the table's rows
# follow as "run | new tokens | prompts | tokens/s | vs kdt plain | accepted | = own plain | = kdt
# plain". A step that would pass $DEADLINE (seconds since the start, default 400) is skipped.
# BUILD_ONLY=1 stops after the builds. Back in $OUT (a few
# files, as the GPU machine returns): summary.txt, the table llamacpp_vs_kdt.md (report.py), and
# llamacpp_logs.tgz, every log (report.py can rerun on it: tar xzf it, then report.py logs/..).
set -u
shopt -u patsub_replacement 2>/dev/null  # '&' in a prompt stays '&' in ${a//pat/rep}
cd "$(dirname "$0")/../.."
TGZ=${1:-.gpu/llama.tgz}
OUT=${OUT:-/tmp/kdt-llamacpp-out}
BUILD=${BUILD:-build}
LLAMA_BUILD=${LLAMA_BUILD:-build-llamacpp}
DEADLINE=${DEADLINE:-400}
PROMPTS=${PROMPTS:-8}
PROMPT_LIMIT=${PROMPT_LIMIT:-30}  # seconds for one prompt's run
# BACKEND=cpu NGL=0 GGUF_TYPE=f32: a dry run on a machine without a GPU (prepare.sh's CHECK=1).
BACKEND=${BACKEND:-cuda} NGL=${NGL:-99} GGUF_TYPE=${GGUF_TYPE:-bf16}
W=/tmp/kdt-llamacpp
LOGS="$W/logs"
rm -rf "$W" && mkdir -p "$LOGS/prompts" "$W/gguf" "$OUT"
npass=0 nfail=0 nskip=0
source scripts/gpu_steps.sh  # say, step (PASS|FAIL|SKIP lines, $OUT/summary.txt)
: >"$OUT/summary.txt"
: >"$LOGS/runs.tsv"

say "gpu: $(nvidia-smi --query-gpu=name,driver_version,memory.used --format=csv,noheader 2>&1 | head -1); commit $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
# LLAMA_DIR: a llama.cpp folder (bin/, src/) instead of the tarball (prepare.sh's CPU check).
L=${LLAMA_DIR:-$W/llama}
[ -n "${LLAMA_DIR:-}" ] || step unpack 30 tar -xf "$TGZ" -C "$W"
say "INFO  llama.cpp: $(cat "$L/VERSION" 2>/dev/null || echo 'no VERSION in the tarball')"

# 1. The builds: kdt when absent, llama.cpp when the tarball holds its source; side by side.
MAKEVARS=(BUILD="$BUILD" CUDA_ARCH="-gencode arch=compute_90a,code=sm_90a")
source scripts/gpu_deps.sh  # libcjson, PCRE2, libmicrohttpd from .deb/ where missing
if [ -x "$BUILD/kdt" ]; then
    say "INFO  $BUILD/kdt present, not rebuilt"
else
    timeout $((DEADLINE - SECONDS)) make -j16 "${MAKEVARS[@]}" "$BUILD/kdt" >"$LOGS/build_kdt.log" 2>&1 &
    kdt_pid=$!
fi
if [ -z "${LLAMA_DIR:-}" ] && [ ! -x "$L/bin/llama-simple" ] && [ -f "$L/src/CMakeLists.txt" ]; then
    step build_llamacpp $((DEADLINE - 60)) bash bench/llamacpp/build.sh "$L/src" "$LLAMA_BUILD" cuda 16 &&
        mkdir -p "$L/bin" "$L/lib" &&
        for t in llama-simple llama-bench llama-lookup llama-speculative llama-speculative-simple llama-tokenize; do
            cp "$LLAMA_BUILD/bin/$t" "$L/bin/"
        done &&
        find "$LLAMA_BUILD" -name 'lib*.so*' -exec cp -P {} "$L/lib/" \; &&
        strip --strip-unneeded "$L"/bin/* "$L"/lib/*.so* 2>/dev/null
    # The built tools and the converter, to carry next time instead of the source.
    [ -x "$L/bin/llama-simple" ] &&
        tar -C "$W" -cf - --exclude='llama/src/ggml' --exclude='llama/src/src' --exclude='llama/src/common' \
            --exclude='llama/src/tools' --exclude='llama/src/examples' --exclude='llama/src/vendor' llama |
        xz -T0 -6 >"$OUT/llama-bin.tar.xz" &&
        say "INFO  packed $OUT/llama-bin.tar.xz ($(du -m "$OUT/llama-bin.tar.xz" | cut -f1) MB)"
    # Files over 16 MiB do not come back from the GPU machine: then in parts (cat them to rejoin).
    if [ -f "$OUT/llama-bin.tar.xz" ] && [ "$(stat -c %s "$OUT/llama-bin.tar.xz")" -gt 16000000 ]; then
        split -b 15000000 -d "$OUT/llama-bin.tar.xz" "$OUT/llama-bin.tar.xz.part" && rm "$OUT/llama-bin.tar.xz"
        say "INFO  split into $(ls "$OUT" | grep -c part) parts: cat llama-bin.tar.xz.part* >llama-bin.tar.xz"
    fi
fi
if [ -n "${kdt_pid:-}" ]; then
    wait "$kdt_pid"
    rc=$?
    say "$([ $rc -eq 0 ] && echo PASS || echo FAIL)  build_kdt (exit $rc, done $SECONDS s after the start)"
    [ $rc -ne 0 ] && tail -20 "$LOGS/build_kdt.log"
fi
if [ "${BUILD_ONLY:-0}" = 1 ]; then
    tar -C "$W" -czf "$OUT/llamacpp_logs.tgz" logs
    say "llamacpp: builds only, $npass passed, $nfail failed in $SECONDS s"
    exit 0
fi

# 2. llama.cpp's libraries, the GGUFs, the prompts.
export LD_LIBRARY_PATH="$L/lib:/usr/local/cuda/lib64${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
missing=$(ldd "$L"/bin/* 2>/dev/null | grep 'not found' | sort -u)
[ -n "$missing" ] && say "INFO  unresolved libraries: $(echo "$missing" | tr '\n' ' ')"
for m in kdt-small kdt-small-draft; do
    step "convert_$m" 90 python3 bench/llamacpp/convert.py "$L/src" "models/$m" "$W/gguf/$m.gguf" --outtype "$GGUF_TYPE"
done
M="$W/gguf/kdt-small.gguf" D="$W/gguf/kdt-small-draft.gguf"
python3 - "$PROMPTS" "$LOGS/prompts" <<'EOF'
import json, sys
n, out = int(sys.argv[1]), sys.argv[2]
texts = [json.loads(l)["text"] for l in open("models/kdt-small/heldout_prompts.jsonl")][:n]
ids = [l.split() for l in open("models/kdt-small/heldout_prompts.ids")][:n]
for i, (t, x) in enumerate(zip(texts, ids)):
    open(f"{out}/{i}.txt", "w").write(t)
    open(f"{out}/{i}.ids", "w").write(",".join(x))
EOF
# llama.cpp tokenizes the text itself (BOS added, as ours); report.py checks it gives our ids.
mkdir -p "$LOGS/tokenize"
prompt_text() { cat "$LOGS/prompts/$1.txt"; echo x; }  # the x keeps the prompt's last newlines in $(...)
for i in $(seq 0 $((PROMPTS - 1))); do
    txt=$(prompt_text "$i")
    timeout 20 "$L/bin/llama-tokenize" -m "$M" --no-escape -p "${txt%x}" --ids --log-disable \
        >"$LOGS/tokenize/p$i.out" 2>"$LOGS/tokenize/p$i.err"
done

# 3. llama-bench: tg96 and tg256 (no prompt), flash attention off and on.
step llama_bench 60 "$L/bin/llama-bench" -m "$M" -ngl "$NGL" -p 0 -n 96,256 -fa 0,1 -r 5 -o md &&
    grep -E '^\|.*tg' "$LOGS/llama_bench.log" | sed 's/^/      /' | tee -a "$OUT/summary.txt"

# run NAME ENGINE N CMD...: CMD once per prompt, {P} and {IDS} replaced by its text and ids; stdout
# to $LOGS/NAME/p<i>.out, stderr to .err; a line in runs.tsv for report.py.
run() {
    local name=$1 engine=$2 n=$3; shift 3
    local t0=$SECONDS left=$((DEADLINE - SECONDS)) ok=0 i a txt ids
    if [ "$left" -lt 10 ]; then say "SKIP  $name (out of time: ${left}s left)"; nskip=$((nskip + 1)); return; fi
    mkdir -p "$LOGS/$name"
    for i in $(seq 0 $((PROMPTS - 1))); do
        txt=$(prompt_text "$i") txt=${txt%x} ids=$(cat "$LOGS/prompts/$i.ids")
        local args=()
        for a in "$@"; do a=${a//"{IDS}"/"$ids"}; args+=("${a//"{P}"/"$txt"}"); done
        left=$((DEADLINE - SECONDS))
        [ "$left" -lt 3 ] && break
        timeout $((left < PROMPT_LIMIT ? left : PROMPT_LIMIT)) "${args[@]}" >"$LOGS/$name/p$i.out" 2>"$LOGS/$name/p$i.err" && ok=$((ok + 1))
    done
    printf '%s\t%s\t%s\n' "$name" "$engine" "$n" >>"$LOGS/runs.tsv"
    local verdict=PASS
    [ $ok -ne "$PROMPTS" ] && verdict=FAIL
    say "$verdict  $name ($ok of $PROMPTS prompts, $((SECONDS - t0)) s)"
    [ $ok -eq "$PROMPTS" ] && npass=$((npass + 1)) || nfail=$((nfail + 1))
}
K=("$BUILD/kdt" generate --backend "$BACKEND" --model models/kdt-small --prompt-ids "{IDS}" --eos 1)
KL=(--spec lookup) KM=(--spec model --draft-model models/kdt-small-draft)
G=(-m "$M" -ngl "$NGL" --no-escape -p "{P}" --temp 0 --top-k 1 --seed 0)
# llama-speculative-simple drafts with nothing unless --spec-type names the drafter.
S="$L/bin/llama-speculative-simple" DM=(-md "$D" -ngld "$NGL") DS=(--spec-type draft-simple)

# 4. Most important first: the 96-token runs of each kind, then the 256-token ones, then the other
# settings. kdt lookup D=8 K=2 N=16 is issue 21's setting, D=8 K=1 N=8 and model D=4 K=2 N=8 the
# fastest at batch 1 in docs/perf/drafters.md, D=16 K=1 N=16 lookup's best at 256 tokens (docs/perf/model.md).
for n in 96 256; do
    run "kdt_plain_n$n" kdt "$n" "${K[@]}" --max-new "$n"
    run "llama_plain_n$n" llama-simple "$n" "$L/bin/llama-simple" -m "$M" -ngl "$NGL" -n "$n" "{P}"
    run "kdt_lookup_D8K2N16_n$n" kdt "$n" "${K[@]}" --max-new "$n" "${KL[@]}" --depth 8 --topk 2 --budget 16
    run "kdt_lookup_D8K1N8_n$n" kdt "$n" "${K[@]}" --max-new "$n" "${KL[@]}" --depth 8 --topk 1 --budget 8
    run "kdt_lookup_D16K1N16_n$n" kdt "$n" "${K[@]}" --max-new "$n" "${KL[@]}" --depth 16 --topk 1 --budget 16
    run "llama_lookup_max8_n$n" llama-lookup "$n" "$L/bin/llama-lookup" "${G[@]}" -n "$n" --spec-draft-n-max 8
    run "kdt_model_D4K2N8_n$n" kdt "$n" "${K[@]}" --max-new "$n" "${KM[@]}" --depth 4 --topk 2 --budget 8
    run "llama_draft_max4_n$n" llama-speculative-simple "$n" "$S" "${G[@]}" "${DM[@]}" "${DS[@]}" -n "$n" --spec-draft-n-max 4
done
n=96
run "llama_lookup_max16_n$n" llama-lookup "$n" "$L/bin/llama-lookup" "${G[@]}" -n "$n" --spec-draft-n-max 16
run "llama_ngram_simple_n$n" llama-speculative-simple "$n" "$S" "${G[@]}" -n "$n" --spec-type ngram-simple --spec-draft-n-max 8
run "llama_draft_max8_n$n" llama-speculative-simple "$n" "$S" "${G[@]}" "${DM[@]}" "${DS[@]}" -n "$n" --spec-draft-n-max 8
run "llama_speculative_max8_n$n" llama-speculative "$n" "$L/bin/llama-speculative" "${G[@]}" "${DM[@]}" -n "$n" --spec-draft-n-max 8
run "kdt_model_D8K2N16_n$n" kdt "$n" "${K[@]}" --max-new "$n" "${KM[@]}" --depth 8 --topk 2 --budget 16

# 5. The table (report.py needs no GPU: rerun it on the returned logs if this step is cut).
DEADLINE=$((DEADLINE + 15)) step report 30 python3 bench/llamacpp/report.py "$LOGS" models/kdt-small/tokenizer.json \
    "$OUT/llamacpp_vs_kdt.md" &&
    grep -E '^\| (kdt|llama)' "$OUT/llamacpp_vs_kdt.md" | cut -d'|' -f3,4,5,8,9,11,12,13 | sed 's/^/      /' | tee -a "$OUT/summary.txt"
tar -C "$W" -czf "$OUT/llamacpp_logs.tgz" logs
say "llamacpp: $npass passed, $nfail failed, $nskip skipped in $SECONDS s (table: $OUT/llamacpp_vs_kdt.md, logs: $OUT/llamacpp_logs.tgz)"
