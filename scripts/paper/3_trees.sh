#!/usr/bin/env bash
# Step 3: the DFS action trees of the training queries and their PRM dataset
# ($RUNS_DIR/$RUN/trees/prm_dataset/{train,validation}.jsonl). Resumable: run it again after a kill.
#   bash scripts/paper/3_trees.sh
source "$(dirname "$0")/env.sh"
export TOOLBENCH_KEY=${TOOLBENCH_KEY:-}
policy_args "$POLICY_GPUS"
codetool pipeline --config "$RECIPE" --name "$RUN" --runs_dir "$RUNS_DIR" --stages trees \
    "${POLICY_ARGS[@]}" --trees.queries "$TOOLBENCH_QUERIES" \
    --trees.tool_server_url "$TOOL_SERVER" --trees.tool_cache_dir "$TOOL_CACHE" "${PIPELINE_ARGS[@]}"
