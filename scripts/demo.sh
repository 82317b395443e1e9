#!/usr/bin/env bash
# The main job: build, run one speculative step's ops on random data through the kdt CLI
# (tree_build -> verify_attn -> tree_accept -> kv_commit), then generate text with the shipped
# model (models/kdt-small), plainly and speculatively (prompt lookup; the draft model
# models/kdt-small-draft), showing the text, whether each run gave the same text as greedy, and
# the speedup. CUDA where a GPU is present, else the CPU. Extra arguments go to kdt generate.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"
bash scripts/check_deps.sh demo
make -j2 build/kdt >/dev/null
echo "== one speculative step, op by op"
python3 python/demo_step.py --kdt build/kdt --work "${TMPDIR:-/tmp}/kdt-demo"

model=models/kdt-small draft=models/kdt-small-draft
log=$(mktemp) txt=$(mktemp)
trap 'rm -f "$log" "$txt"' EXIT
rate() { sed -n 's/.*decode [0-9]* tokens in [0-9.]* s (\([0-9.]*\) tokens\/s).*/\1/p' "$log" | tail -n 1; }

if [ ! -f "$model/config.json" ]; then
    prompt=5,6,7,8,5,6,7,8,5,6,7,8
    echo "== $model is missing: kdt generate --model builtin --prompt-ids $prompt --max-new 48 (random weights)"
    plain=$(build/kdt generate --model builtin --prompt-ids "$prompt" --max-new 48 "$@")
    echo "greedy:      $plain"
    for spec in "lookup --depth 4 --topk 2 --budget 8" "model --depth 4 --topk 2 --budget 8"; do
        out=$(build/kdt generate --model builtin --prompt-ids "$prompt" --max-new 48 --spec $spec "$@")
        echo "--spec ${spec%% *}: $([ "$out" = "$plain" ] && echo "same tokens as greedy" || echo "DIFFERENT from greedy")"
    done
    exit 0
fi

prompt=$'import argparse\n\n\ndef parse_args():'
echo "== kdt generate --model $model --prompt '${prompt//$'\n'/\\n}' --max-new 96"
gen() { build/kdt generate --model "$model" --prompt "$prompt" --max-new 96 "$@" 2>"$log" | tee "$txt"; }  # streams
gen "$@"
plain=$(cat "$txt") base=$(rate)
echo "-- greedy: $base tokens/s"
for spec in "lookup --depth 8 --topk 2 --budget 16" "model --draft-model $draft --depth 4 --topk 2 --budget 8"; do
    [ "${spec%% *}" = model ] && [ ! -f "$draft/config.json" ] && { echo "-- --spec model: $draft is missing"; continue; }
    echo "== --spec $spec"
    gen --spec $spec "$@"
    out=$(cat "$txt") r=$(rate)
    acc=$(sed -n 's/.*mean accepted length \([0-9.]*\).*/\1/p' "$log")
    same=$([ "$out" = "$plain" ] && echo "same text as greedy" || echo "DIFFERENT from greedy")
    echo "-- --spec ${spec%% *}: $same; mean accepted length $acc; $r tokens/s, $(awk -v a="$r" -v b="$base" 'BEGIN { printf "%.2fx", a / b }') greedy's speed"
done
