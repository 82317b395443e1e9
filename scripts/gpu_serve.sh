#!/usr/bin/env bash
# The serving load benchmark on a GPU machine (no network): builds kdt, then for each --spec
# (none, lookup; model when models/kdt-small-draft exists) starts `kdt serve` on 127.0.0.1 with
# the shipped model and runs bench/serve_load.py at 1, 8, 32 and 64 concurrent clients. Results
# go to $OUT (default /tmp/kdt-serve): serve_load.csv, serve_load.png (when matplotlib is there),
# one server log per spec. Every step is bounded in time; the whole run fits the device tool's
# 600 s per command.
#   bash scripts/gpu_serve.sh [MODEL_DIR]          (default models/kdt-small)
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kdt-serve}
BUILD=${BUILD:-build}
MODEL=${1:-models/kdt-small}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

# cJSON and libmicrohttpd: Debian's, carried as .deb files where the machine lacks them
# (`apt-get download libcjson1 libcjson-dev libmicrohttpd12 libmicrohttpd-dev` into .deb/).
MAKEVARS=(BUILD="$BUILD" CUDA_ARCH="-gencode arch=compute_90,code=sm_90")
if { ! ldconfig -p | grep -q libcjson || ! ldconfig -p | grep -q libmicrohttpd; } && [ -d .deb ]; then
    for f in .deb/*.deb; do dpkg -x "$f" /tmp/kdt-debs; done
    lib=/tmp/kdt-debs/usr/lib/x86_64-linux-gnu
    MAKEVARS+=(CPPFLAGS=-I/tmp/kdt-debs/usr/include LDFLAGS="-L$lib -Wl,-rpath,$lib")
    export LD_LIBRARY_PATH="$lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
fi
timeout 300 make -j16 "${MAKEVARS[@]}" "$BUILD/kdt" >"$OUT/build.log" 2>&1 || { tail -30 "$OUT/build.log"; exit 1; }
[ -d "$MODEL" ] || { echo "gpu_serve: no model folder $MODEL"; exit 1; }
VOCAB=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1] + '/config.json'))['vocab_size'])" "$MODEL")

SPECS=(none lookup)
[ -d models/kdt-small-draft ] && SPECS+=(model)
rm -f "$OUT/serve_load.csv"
for spec in "${SPECS[@]}"; do
    extra=()
    [ "$spec" = model ] && extra=(--draft-model models/kdt-small-draft)
    log="$OUT/server_$spec.log"
    timeout 200 "$BUILD/kdt" serve --model "$MODEL" --host 127.0.0.1 --port 0 --backend cuda --spec "$spec" "${extra[@]}" \
        --max-batch 64 --ctx 2048 2>"$log" &
    pid=$!
    port=""
    for _ in $(seq 600); do  # up to 60 s to load
        port=$(grep -o 'listening on http://127.0.0.1:[0-9]*' "$log" | sed 's/.*://')
        [ -n "$port" ] && curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break
        kill -0 $pid 2>/dev/null || break
        sleep 0.1
    done
    if [ -z "$port" ] || ! curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1; then
        echo "gpu_serve: the $spec server did not come up"; tail -5 "$log"; kill $pid 2>/dev/null; continue
    fi
    timeout 150 python3 bench/serve_load.py --port "$port" --label "$spec" --vocab "$VOCAB" --concurrency 1,8,32,64 \
        --requests 256 --seconds 25 --timeout 60 --prompt-len 128 --max-tokens 128 --csv "$OUT/serve_load.csv"
    curl -s "http://127.0.0.1:$port/metrics" >"$OUT/metrics_$spec.txt"
    kill -TERM $pid
    wait $pid
    echo "gpu_serve: $spec server exit $?"
done
python3 bench/serve_load.py --csv "$OUT/serve_load.csv" --plot "$OUT/serve_load.png" --plot-only || true
column -s, -t <"$OUT/serve_load.csv" 2>/dev/null || cat "$OUT/serve_load.csv"
