#!/usr/bin/env bash
# The learning benchmark's RL stage on one GPU machine (recipes/smollm2/learning/trloo_gpu.yaml).
#
#   bash benchmarks/learning_gpu_rl.sh SFT_MODEL TRAIN_PARQUET RUN_DIR [kernelrl train args...]
#
# SFT_MODEL: the SFT checkpoint the CPU benchmark chose (runs/bench/learning/stages.json,
# select_sft); TRAIN_PARQUET: its synth/tasks/train/data.parquet. Rerunning with the same RUN_DIR
# continues from the last checkpoint; `--stop_after_s N` ends a run at a step boundary, with a
# checkpoint, for machines lent for a limited time. With $OUT set, the LoRA adapters and trainer
# state of the checkpoints no earlier call packed, with the log and the rollouts, go to
# $OUT/rl_run.tgz.N (pieces of 15 MiB: `cat rl_run.tgz.* | tar -xz`); the CPU box then
# validates, selects and evaluates them:
#   python benchmarks/learning.py ... --rl-from RUN_DIR_BACK_HERE --rl-tag gpu
# or the GPU machine does, in far less time (benchmarks/learning_gpu.sh, which also runs this).
# On a machine with several GPUs one rank runs per GPU (accelerate, DDP), each generating its
# share of the step's 16 prompts x 8 samples and timing its kernels on its own GPU: the same
# optimizer step, in a fraction of the time.
set -euo pipefail
if [ $# -lt 3 ]; then
  sed -n 2,18p "$0"
  exit 2
fi
model=$1 tasks=$2 run=$3
shift 3
root=$(cd "$(dirname "$0")/.." && pwd)
recipe=recipes/smollm2/learning/trloo_gpu.yaml
mkdir -p "$run"
options=()
if compgen -G "$run/checkpoint-*" > /dev/null; then options=(--resume_from_checkpoint true); fi
gpus=$(python3 -c "import torch; print(torch.cuda.device_count())")
ranks=1
while [ $((ranks * 2)) -le "$gpus" ] && [ $((ranks * 2)) -le 16 ]; do ranks=$((ranks * 2)); done
launch=(python3 -m kernelrl.launch.cli)
if [ "$ranks" -gt 1 ]; then  # the recipe's 16 prompts x 8 samples per step, split over the ranks
  export NCCL_NVLS_ENABLE=0
  launch=(python3 -m accelerate.commands.launch --multi_gpu --num_machines 1
    --num_processes "$ranks" --mixed_precision bf16 --dynamo_backend no -m kernelrl.launch.cli)
  options+=(--per_device_train_batch_size $((16 / ranks)))
fi
started=$(date +%s)
status=0
# The run's results store: a completion repeated in a group, a step or a resumed run is
# evaluated once (half of a step's 128 rollouts repeated one another; benchmarks/README.md).
"${launch[@]}" train --config "$root/$recipe" \
  --model_name_or_path "$model" --tasks "parquet:$tasks" --output_dir "$run" \
  --env_store_path "$run/env_results.sqlite" "${options[@]}" "$@" 2>&1 |
  tee -a "$run/train.log" || status=$?
python3 - "$run" "$started" "$status" "$recipe" "$ranks" "$@" <<'PY'
import json, sys, time
from pathlib import Path

import torch

run, started, status, recipe = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
ranks, extra = int(sys.argv[5]), sys.argv[6:]
record = {
    "device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else "cpu",
    "ranks": ranks,
    "recipe": recipe,
    "extra_args": extra,
    "exit_status": status,
    "wall_s": time.time() - started,
}
runs = json.loads((run / "runs.json").read_text()) if (run / "runs.json").exists() else []
(run / "runs.json").write_text(json.dumps(runs + [record], indent=1))
PY
if [ -n "${OUT:-}" ]; then  # the checkpoints not packed by an earlier call, in 15 MiB pieces
  new=()
  for folder in "$run"/checkpoint-*; do
    name=$(basename "$folder")
    [ -d "$folder" ] && ! grep -qx "$name" "$run/returned.txt" 2>/dev/null && new+=("$name")
  done
  (cd "$run" && tar -czf - --exclude=optimizer.pt --exclude='rng_state*' --exclude=scheduler.pt \
    --exclude=tokenizer.json --exclude='kernelrl_state_*' ${new[@]+"${new[@]}"} train.log runs.json \
    $(ls -d rollouts 2>/dev/null)) |
    split -b 15M -d -a 1 - "$OUT/rl_run.tgz."
  printf '%s\n' ${new[@]+"${new[@]}"} >> "$run/returned.txt"
fi
exit $status
