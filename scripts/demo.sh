#!/usr/bin/env bash
# The main job, for now: build, then run one speculative step's ops on random data with the kdt
# CLI (tree_build -> verify_attn -> tree_accept -> kv_commit), on CUDA where a GPU is present.
set -euo pipefail
cd "$(dirname "$0")/.."
[ -d /usr/local/cuda/bin ] && export PATH="$PATH:/usr/local/cuda/bin"
make -j2 build/kdt >/dev/null
exec python3 python/demo_step.py --kdt build/kdt --work "${TMPDIR:-/tmp}/kdt-demo" "$@"
