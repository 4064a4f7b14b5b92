#!/usr/bin/env bash
# Submit `codetool build-trees` as a Slurm job array of N shards plus its merge step (issue 28):
#
#   scripts/slurm/submit_trees.sh N [build-trees options...]
#   scripts/slurm/submit_trees.sh 8 --config configs/trees.yaml --output runs/trees/trees.jsonl
#
# Prints the two job ids. The merge waits for every array task (afterany) and refuses to merge
# while a shard is missing trees, naming the shards to run again. SBATCH_ARGS adds options to
# both submissions (e.g. SBATCH_ARGS="--partition=gpu --account=me").
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
n=${1:?usage: $0 N [build-trees options...]}
shift
case $n in ''|*[!0-9]*|0) echo "N must be a positive number of shards, got '$n'" >&2; exit 2 ;; esac
# shellcheck disable=SC2086  # SBATCH_ARGS holds several options
array=$(sbatch --parsable ${SBATCH_ARGS:-} --array="0-$((n - 1))" "$here/build_trees.sbatch" "$@")
array=${array%%;*}  # "jobid;cluster" on federated clusters
# shellcheck disable=SC2086
merge=$(sbatch --parsable ${SBATCH_ARGS:-} --dependency="afterany:$array" "$here/merge_trees.sbatch" "$@")
echo "array job $array ($n shards), merge job ${merge%%;*}"
