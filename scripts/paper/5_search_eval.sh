#!/usr/bin/env bash
# Step 5: the search with every method and the evaluation, then the report
# ($RUNS_DIR/$RUN/report.md). The policy on SEARCH_POLICY_GPUS, the trained PRM served from
# PRM_GPUS (one serve-prm per GPU), the judge (gpt-4-turbo-2024-04-09, CodeTool's procedure) with
# its prompts read from your CodeTool clone. Resumable, stage by stage.
#   export OPENAI_API_KEY=...; bash scripts/paper/5_search_eval.sh
source "$(dirname "$0")/env.sh"
prm=$PRM_DIR
ANSWER_ARGS=(--answer.reference_dir "$CODETOOL_DIR")  # CodeTool's final-answer prompts, from the clone
if [ "$REHEARSAL" != 1 ]; then
    stop policy-
    GPUS="$SEARCH_POLICY_GPUS" bash scripts/paper/2_serve_policy.sh
    j=0 urls=""
    for gpu in $PRM_GPUS; do
        CUDA_VISIBLE_DEVICES=$gpu start "prm-$j" "$RUNS_DIR/$RUN/prm-$j.log" "$PY" -m codetool.cli serve-prm \
            --prm "$PRM_DIR" --port $((PRM_PORT + j)) --device cuda
        urls+="${urls:+,}http://127.0.0.1:$((PRM_PORT + j))"
        j=$((j + 1))
    done
    for url in ${urls//,/ }; do wait_for "$url/health" 900; done
    prm=$urls
else
    ANSWER_ARGS=()  # the placeholder checkout has the judge's layout only: our final-answer texts
fi
policy_args "$SEARCH_POLICY_GPUS"
codetool pipeline --config "$RECIPE" --name "$RUN" --runs_dir "$RUNS_DIR" --stages search eval \
    "${POLICY_ARGS[@]}" --prm_checkpoint "$prm" --judge.reference_dir "$CODETOOL_DIR" "${ANSWER_ARGS[@]}" \
    "${PIPELINE_ARGS[@]}"
echo "report: $RUNS_DIR/$RUN/report.md"
