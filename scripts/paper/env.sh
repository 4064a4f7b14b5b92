# The settings of the paper path (docs/PAPER.md), sourced by every step. Any of them may be set in
# the environment first. REHEARSAL=1 runs the same steps on a CPU with the embedded 135M model, a
# few queries and local stand-ins for the servers (scripts/paper/rehearse.sh; CI runs it).
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/../.."
REHEARSAL=${REHEARSAL:-0}
PY=${PY:-.venv/bin/python}
codetool() { "$PY" -m codetool.cli "$@"; }
RUNS_DIR=${RUNS_DIR:-runs}
DATA=${DATA:-data}                                   # codetool data fetch writes here
RECIPE=${RECIPE:-configs/pipeline/paper-qwen2.5-7b.yaml}
RUN=${RUN:-paper-qwen2.5-7b}                        # everything goes to $RUNS_DIR/$RUN/
STATE="$RUNS_DIR/$RUN/servers"                      # pids and logs of the servers the steps start
# The models (CodeTool, Lu et al. ACL 2025): the policy behind vLLM, the PRM base model.
POLICY_MODEL=${POLICY_MODEL:-Qwen/Qwen2.5-Coder-7B-Instruct}
PRM_BASE=${PRM_BASE:-Qwen/Qwen2.5-7B-Instruct}
PRM_DIR=${PRM_DIR:-checkpoints/prm/qwen2.5-7b}
# 8 GPUs: one vLLM replica of the policy per GPU in POLICY_GPUS (data parallel: codetool sends a
# query's requests to one replica, whose prefix cache keeps its prompts); during the search the PRM
# is served from PRM_GPUS (one serve-prm per GPU). Training the PRM takes all 8 (vLLM stopped).
POLICY_GPUS=${POLICY_GPUS:-"0 1 2 3 4 5 6 7"}      # trees: every GPU serves the policy
SEARCH_POLICY_GPUS=${SEARCH_POLICY_GPUS:-"0 1 2 3 4 5"}
PRM_GPUS=${PRM_GPUS:-"6 7"}
TRAIN_GPUS=${TRAIN_GPUS:-8}
POLICY_PORT=${POLICY_PORT:-8001}                    # replica i listens on POLICY_PORT + i
PRM_PORT=${PRM_PORT:-8600}                          # serve-prm j listens on PRM_PORT + j
MAX_NUM_SEQS=${MAX_NUM_SEQS:-64}                    # vllm --max-num-seqs = policy_client.max_in_flight per replica
# The StableToolBench server (its server/main.py, with its tools folder and response cache):
TOOL_SERVER=${TOOL_SERVER:-http://127.0.0.1:8080/virtual}
TOOL_CACHE=${TOOL_CACHE:-$DATA/tool_response_cache}
# Your clones of the reference repositories (read at run time, never copied here):
CODETOOL_DIR=${CODETOOL_DIR:-${CODETOOL_CODETOOL_DIR:-../CodeTool}}
TOOLBENCH_QUERIES=${TOOLBENCH_QUERIES:-$DATA/ToolBench/data/instruction/G1_query.json}
TRAIN_CONFIG=${TRAIN_CONFIG:-configs/train/qwen2.5-7b.yaml}
ACCELERATE_CONFIG=${ACCELERATE_CONFIG:-configs/accelerate/deepspeed_zero3.yaml}
# Extra settings for every pipeline call (the rehearsal shrinks the run with these):
PIPELINE_ARGS=()
TRAIN_ARGS=()

if [ "$REHEARSAL" = 1 ]; then
    SHARED=${SHARED:-../shared/data}                # a local copy of the benchmark files (else: downloaded)
    POLICY_MODEL=default                            # the embedded 135M model, in-process (no vLLM)
    PRM_BASE=default
    PRM_DIR="$RUNS_DIR/$RUN/prm"
    TOOL_SERVER=http://127.0.0.1:${TOOL_PORT:-18080}/virtual   # serve-mock stabletoolbench stands in
    TOOL_CACHE="$RUNS_DIR/$RUN/tool_response_cache"
    CODETOOL_DIR="$RUNS_DIR/$RUN/stub-CodeTool"     # placeholder text in CodeTool's layout (stub_checkout.py)
    TOOLBENCH_QUERIES="$DATA/ToolBench/data_example/instruction/G1_query.json"
    TRAIN_CONFIG=configs/train/quickstart.yaml
    TRAIN_ARGS=(--max_steps 2 --format.max_length 512 --eval_steps 0 --save_steps 100)
    PIPELINE_ARGS=(--tool_doc brief --trees.limit 2 --trees.max_depth 1 --trees.emit nodes --trees.search.max_new_tokens 24
                   --search.max_new_tokens 24 --search.max_steps 1 --answer.max_new_tokens 24
                   --executor.timeout_s 20 --policy_client.timeout_s 60
                   --methods '[{name: spot-only, k: 2, w_latent: 0.0, latent: none}, {name: spot+latent, k: 2, latent: prm}]'
                   --evals "[{benchmark: stabletoolbench, group: G1_instruction, subset: codetool, limit: 2, tools_backend: stabletoolbench, tool_server_url: '$TOOL_SERVER', tool_cache_dir: '$TOOL_CACHE'}, {benchmark: restbench-tmdb, subset: codetool, limit: 1, max_observation_chars: 1500}]"
                   --judge.model default --judge.remote_model "" --judge.api_key_env "" --judge.rounds 1
                   --judge.max_new_tokens 32)
fi

# The policy, as the pipeline reaches it: the vLLM replicas (comma-separated URLs), or in-process.
policy_urls() {
    local urls="" i=0
    for _ in $1; do urls+="${urls:+,}http://127.0.0.1:$((POLICY_PORT + i))/v1"; i=$((i + 1)); done
    echo "$urls"
}
policy_args() {  # POLICY_ARGS: the pipeline's --policy, the servers of the GPUs in $1 or the in-process model
    if [ "$REHEARSAL" = 1 ]; then
        POLICY_ARGS=(--policy "$POLICY_MODEL" --remote_model "")
    else
        POLICY_ARGS=(--policy "$(policy_urls "$1")" --remote_model policy)
    fi
}

# Start a background server: start NAME LOG COMMAND...; its pid goes to $STATE/NAME.pid
start() {
    local name=$1 log=$2; shift 2
    mkdir -p "$STATE"
    nohup "$@" >"$log" 2>&1 &
    echo $! >"$STATE/$name.pid"
    echo "started $name (pid $!, log $log)"
}
# Wait until URL answers (up to $2 seconds), else show the log and stop.
wait_for() {
    local url=$1 limit=${2:-900} log=${3:-} waited=0
    until curl -sf -o /dev/null "$url"; do
        sleep 5; waited=$((waited + 5))
        if [ "$waited" -ge "$limit" ]; then
            echo "no answer from $url after ${limit}s${log:+; the last lines of $log:}" >&2
            [ -n "$log" ] && tail -20 "$log" >&2
            exit 1
        fi
    done
}
# Stop the servers this path started (by the pids it wrote), all or those named NAME*.
stop() {
    local pattern=${1:-}
    for pidfile in "$STATE"/${pattern}*.pid; do
        [ -f "$pidfile" ] || continue
        kill "$(cat "$pidfile")" 2>/dev/null || true
        rm -f "$pidfile"
    done
}
