#!/usr/bin/env bash
# Trains the shipped small model and its draft model on the GPU machine in one call:
#   bash scripts/gpu_train_small.sh [extra train_small_model.py options]
# BUDGET (seconds, default 340) is the training script's whole run, data preparation included; it stops
# training in time to evaluate and save. Writes models/kdt-small and models/kdt-small-draft here, then
# packs them into $OUT (default /tmp/kdt-train) as kdt-small.tgz.part0, part1, ... (15 MB pieces) plus
# train_stdout.txt, and prints a summary. Unpack on the other machine:
#   cat kdt-small.tgz.part* | tar -xzf -        (from the repository root: it holds models/...)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kdt-train}
BUDGET=${BUDGET:-340}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true

# The engine's bench is built meanwhile, at low priority, so that scripts/gpu_drafters.sh finds it built on
# the same (still warm) machine: build outputs stay between calls. PREBUILD=0 skips it.
build_pid=
if [ "${PREBUILD:-1}" = 1 ] && command -v nvcc >/dev/null; then
    MAKEVARS=(BUILD="${BUILD:-build}" CUDA_ARCH="-gencode arch=compute_90a,code=sm_90a")
    source scripts/gpu_deps.sh  # libcjson, PCRE2, libmicrohttpd from .deb/ where missing
    setsid nice -n 19 make -j6 "${MAKEVARS[@]}" "${BUILD:-build}/bench/bench_drafters" >/tmp/kdt_prebuild.log 2>&1 &
    build_pid=$!
fi

nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader 2>&1 | head -1
python3 -c 'import torch, transformers, tokenizers; print("torch", torch.__version__, "transformers", transformers.__version__, "tokenizers", tokenizers.__version__)'

timeout $((BUDGET + 150)) python3 python/train_small_model.py --out models --budget-s "$BUDGET" "$@" 2>&1 \
    | tee "$OUT/train_stdout.txt"
rc=${PIPESTATUS[0]}
echo "## train_small_model.py: exit $rc after $SECONDS s"
if [ -n "$build_pid" ]; then  # wait for the build while the call has time left, else stop it (make resumes)
    while kill -0 "$build_pid" 2>/dev/null && [ "$SECONDS" -lt 540 ]; do sleep 2; done
    if kill -0 "$build_pid" 2>/dev/null; then kill -- -"$build_pid"; echo "## prebuild: stopped unfinished"
    else wait "$build_pid"; echo "## prebuild of bench_drafters: exit $? ($(tail -1 /tmp/kdt_prebuild.log))"; fi
fi

tar -cf - models/kdt-small models/kdt-small-draft | gzip -1 | split -b 15m -d -a 1 - "$OUT/kdt-small.tgz.part"
ls -l "$OUT"

python3 - <<'EOF'
import json
try:
    ev = json.load(open("models/kdt-small/eval.json"))
except OSError as e:
    raise SystemExit(f"no eval.json: {e}")
print("## params: target %.2f M, draft %.2f M" % (ev["params"]["target"] / 1e6, ev["params"]["draft"] / 1e6))
print("## steps %d, tokens %.1f M, %.0f s; final loss %s" % (ev["steps"], ev["train_tokens"] / 1e6, ev["train_seconds"], ev["final_loss"]))
print("## held-out perplexity: target %.3f, draft %.3f" % (ev["heldout_perplexity"]["target"], ev["heldout_perplexity"]["draft"]))
print("## read back:", ev["readback_rel_diff"])
if ev["samples"]:
    s = ev["samples"][0]
    print("## sample prompt:\n" + s["prompt"] + "\n## continuation:\n" + s["continuation"])
EOF
exit $rc
