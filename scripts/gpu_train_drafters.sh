#!/usr/bin/env bash
# Trains the shipped model's DFlash drafter and MTP layer on the GPU machine in one call:
#   bash scripts/gpu_train_drafters.sh [extra train_drafters.py options]
# Needs models/kdt-small here (carry it). BUDGET (seconds, default 280) is the training script's whole
# run, data preparation included. Writes models/kdt-small-dflash and models/kdt-small-mtp, packs them
# into $OUT (default /tmp/kdt-train) as kdt-drafters.tgz with train_drafters_stdout.txt, and prints
# each one's held-out top-1 accuracy by depth. Unpack from the repository root: tar -xzf kdt-drafters.tgz
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp/kdt-train}
BUDGET=${BUDGET:-280}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=true

nvidia-smi --query-gpu=name,memory.used,memory.total --format=csv,noheader 2>&1 | head -1
timeout $((BUDGET + 120)) python3 python/train_drafters.py --target models/kdt-small --out models --budget-s "$BUDGET" "$@" 2>&1 \
    | tee "$OUT/train_drafters_stdout.txt"
rc=${PIPESTATUS[0]}
echo "## train_drafters.py: exit $rc after $SECONDS s"
tar -czf "$OUT/kdt-drafters.tgz" models/kdt-small-dflash models/kdt-small-mtp
ls -l "$OUT"
for d in models/kdt-small-dflash models/kdt-small-mtp; do
    python3 -c 'import json, sys; j = json.load(open(sys.argv[1] + "/train_log.json")); print("##", sys.argv[1], j["steps"], "steps, held-out", j["heldout"])' "$d"
done
exit $rc
