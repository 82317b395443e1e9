#!/usr/bin/env bash
# The serving load benchmark on a GPU machine (no network). Steps (default all; each fits the
# device tool's 600 s per command when run alone):
#   build  builds build/kdt (CUDA)
#   small  `kdt serve` on the shipped model (models/kdt-small) with --spec none and lookup (and
#          model when models/kdt-small-draft exists)
#   kimi   `kdt serve --random-config` with Kimi K2's per-layer dims (4 layers, 64 experts, its
#          163840-token vocabulary) and random bf16 weights, --spec none and lookup
# For each server, bench/serve_load.py at 1, 8, 32 and 64 concurrent clients on 127.0.0.1.
# Results in $OUT (default /tmp/kdt-serve): serve_load.csv, serve_load.png (with matplotlib),
# server logs and a /metrics scrape per run.
#   bash scripts/gpu_serve.sh [build] [small] [kimi]
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kdt-serve}
BUILD=${BUILD:-build}
MODEL=${MODEL:-models/kdt-small}
STEPS=${*:-build small kimi}
LEVEL_S=${LEVEL_S:-20}   # seconds per concurrency level
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
has() { [[ " $STEPS " == *" $1 "* ]]; }

MAKEVARS=(BUILD="$BUILD" CUDA_ARCH="-gencode arch=compute_90a,code=sm_90a")
source scripts/gpu_deps.sh  # libcjson, PCRE2, libmicrohttpd from .deb/ where missing
if has build; then
    timeout 400 make -j16 "${MAKEVARS[@]}" "$BUILD/kdt" >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
    echo "gpu_serve: built $BUILD/kdt"
fi

# serve_and_load LABEL VOCAB SERVER_ARGS...: one server, the four levels, SIGTERM, its exit code.
serve_and_load() {
    local label=$1 vocab=$2; shift 2
    local log="$OUT/server_$label.log" port="" pid
    timeout $((LEVEL_S * 4 + 150)) "$BUILD/kdt" serve --host 127.0.0.1 --port 0 --backend cuda --max-batch 64 --ctx 2048 "$@" \
        2>"$log" &
    pid=$!
    for _ in $(seq 900); do  # up to 90 s to load
        port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$log" | sed 's/.*://')
        [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
        kill -0 $pid 2>/dev/null || break
        sleep 0.1
    done
    if [ -z "$port" ] || ! curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then
        echo "gpu_serve: the $label server did not come up"; tail -5 "$log"; kill $pid 2>/dev/null; return 1
    fi
    timeout $((LEVEL_S * 4 + 100)) python3 bench/serve_load.py --port "$port" --label "$label" --vocab "$vocab" \
        --concurrency 1,8,32,64 --requests 512 --seconds "$LEVEL_S" --timeout 60 --prompt-len 128 --max-tokens 128 \
        --csv "$OUT/serve_load.csv"
    curl -s "http://127.0.0.1:$port/metrics" >"$OUT/metrics_$label.txt"
    kill -TERM $pid
    wait $pid
    echo "gpu_serve: $label server exit $?"
}

if has small; then
    if [ -d "$MODEL" ]; then
        vocab=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1] + '/config.json'))['vocab_size'])" "$MODEL")
        serve_and_load small-none "$vocab" --model "$MODEL" --spec none
        serve_and_load small-lookup "$vocab" --model "$MODEL" --spec lookup
        [ -d models/kdt-small-draft ] &&
            serve_and_load small-model "$vocab" --model "$MODEL" --spec model --draft-model models/kdt-small-draft
    else
        echo "gpu_serve: no model folder $MODEL, step small skipped"
    fi
fi

if has kimi; then
    cat >"$OUT/kimi_dims.json" <<'JSON'
{"architectures": ["DeepseekV3ForCausalLM"], "vocab_size": 163840, "hidden_size": 7168, "intermediate_size": 18432,
 "moe_intermediate_size": 2048, "num_hidden_layers": 4, "num_attention_heads": 64, "q_lora_rank": 1536,
 "kv_lora_rank": 512, "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128, "n_routed_experts": 64,
 "n_shared_experts": 1, "num_experts_per_tok": 8, "n_group": 1, "topk_group": 1, "first_k_dense_replace": 1,
 "moe_layer_freq": 1, "norm_topk_prob": true, "routed_scaling_factor": 2.827, "max_position_embeddings": 131072,
 "rms_norm_eps": 1e-06, "rope_theta": 50000.0, "tie_word_embeddings": false,
 "rope_scaling": {"beta_fast": 1.0, "beta_slow": 1.0, "factor": 32.0, "mscale": 1.0, "mscale_all_dim": 1.0,
                  "original_max_position_embeddings": 4096, "type": "yarn"}}
JSON
    serve_and_load kimi-none 163840 --random-config "$OUT/kimi_dims.json" --spec none
    serve_and_load kimi-lookup 163840 --random-config "$OUT/kimi_dims.json" --spec lookup
fi

if [ -f "$OUT/serve_load.csv" ]; then
    python3 bench/serve_load.py --csv "$OUT/serve_load.csv" --plot "$OUT/serve_load.png" --plot-only || true
    column -s, -t <"$OUT/serve_load.csv" 2>/dev/null || cat "$OUT/serve_load.csv"
fi
