#!/usr/bin/env bash
# Step 4: the PRM. Full fine-tuning of Qwen2.5-7B-Instruct with DeepSpeed ZeRO-3 on the 8 GPUs
# (the policy replicas are stopped first: they hold the GPUs' memory). Resumes from its last whole
# checkpoint. On one GPU: ACCELERATE_CONFIG=configs/accelerate/single_gpu.yaml TRAIN_GPUS=1
# TRAIN_CONFIG=configs/train/qwen2.5-7b-lora.yaml.
#   bash scripts/paper/4_train.sh
source "$(dirname "$0")/env.sh"
stop policy-
data="$RUNS_DIR/$RUN/trees/prm_dataset"
if [ "$REHEARSAL" = 1 ]; then
    codetool train-prm --config "$TRAIN_CONFIG" --model "$PRM_BASE" --dataset "$data/train.jsonl" \
        --eval_dataset "$data/validation.jsonl" --output_dir "$PRM_DIR" "${TRAIN_ARGS[@]}"
else
    "$PY" -m accelerate.commands.launch --config_file "$ACCELERATE_CONFIG" --num_processes "$TRAIN_GPUS" \
        -m codetool.cli train-prm --config "$TRAIN_CONFIG" --model "$PRM_BASE" --dataset "$data/train.jsonl" \
        --eval_dataset "$data/validation.jsonl" --output_dir "$PRM_DIR" "${TRAIN_ARGS[@]}"
fi
