#!/usr/bin/env bash
# The main job: build, run one speculative step's ops on random data through the kdt CLI
# (tree_build -> verify_attn -> tree_accept -> kv_commit), then decode with the built-in model,
# plainly and speculatively, and check that both emit the same tokens. CUDA where a GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"
bash scripts/check_deps.sh demo
make -j2 build/kdt >/dev/null
echo "== one speculative step, op by op"
python3 python/demo_step.py --kdt build/kdt --work "${TMPDIR:-/tmp}/kdt-demo"
prompt=5,6,7,8,5,6,7,8,5,6,7,8
echo "== kdt generate --prompt-ids $prompt --max-new 48 (built-in model)"
plain=$(build/kdt generate --prompt-ids "$prompt" --max-new 48 "$@")
echo "greedy:      $plain"
for spec in "lookup --depth 4 --topk 2 --budget 8" "model --depth 4 --topk 2 --budget 8"; do
    out=$(build/kdt generate --prompt-ids "$prompt" --max-new 48 --spec $spec "$@")
    same=$([ "$out" = "$plain" ] && echo "same tokens as greedy" || echo "DIFFERENT from greedy")
    echo "--spec ${spec%% *}: $same"
done
