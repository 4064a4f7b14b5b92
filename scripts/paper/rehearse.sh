#!/usr/bin/env bash
# The paper path's CPU rehearsal: steps 0-5 as written, with REHEARSAL=1 (the embedded 135M model
# in-process for the policy, the PRM base and the judge; serve-mock stabletoolbench for the tool
# server; a placeholder CodeTool checkout; 2 training trees, 2 steps of training, 2 + 1 evaluation
# queries). About 5 minutes on 2 cores; CI runs it (tests/test_scripts_paper.py, a slow test).
#   RUNS_DIR=/tmp/paper bash scripts/paper/rehearse.sh
set -euo pipefail
here="$(dirname "$0")"
export REHEARSAL=1
trap 'source "$here/env.sh"; stop' EXIT
for step in 0_check 1_data 2_serve_policy 3_trees 4_train 5_search_eval; do
    echo "== $step"
    bash "$here/$step.sh"
done
