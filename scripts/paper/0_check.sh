#!/usr/bin/env bash
# Step 0: check the node before spending hours on it: PRM scoring, training, checkpoints and
# generation on the GPU, one JSON (reports/gpu_check/gpu_check.json, < 8 min; docs/PAPER.md).
#   bash scripts/paper/0_check.sh
source "$(dirname "$0")/env.sh"
if [ "$REHEARSAL" = 1 ]; then
    "$PY" benchmarks/gpu_check.py --device cpu --tiny --out "$RUNS_DIR/$RUN/gpu_check"
else
    make gpu-check
fi
