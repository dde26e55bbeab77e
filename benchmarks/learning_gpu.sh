#!/usr/bin/env bash
# The learning benchmark's GPU stages on a GPU machine, after the CPU box ran synth, sft and
# select_sft (benchmarks/learning.py --stop-after select_sft):
#
#   bash benchmarks/learning_gpu.sh BENCH_DIR SFT_MODEL curriculum
#   bash benchmarks/learning_gpu.sh BENCH_DIR SFT_MODEL rl [kernelrl train args, e.g. --stop_after_s N]
#   bash benchmarks/learning_gpu.sh BENCH_DIR SFT_MODEL evaluate [stages, default: rl select_rl eval_sft eval_rl]
#
# BENCH_DIR: the CPU box's benchmark folder (stages.json, synth/tasks/train, tasks/), copied
# here; SFT_MODEL: the checkpoint select_sft chose, on this machine. curriculum: the SFT model's
# pass rates on a sample of train tasks, keeping those it solves sometimes; rl: TRLOO on them
# (benchmarks/learning_gpu_rl.sh, resumable); evaluate: validation and choice of RL's
# checkpoints, then held-out sweeps of the SFT model and the chosen checkpoint (add
# train_check: both again on RL's train tasks). Every sweep runs here with the transformers
# client and the GPU environment, so the stages it compares share one generator and one judge.
# The report is written on the CPU box: learning.py --out BENCH_DIR --only report.
set -euo pipefail
if [ $# -lt 3 ]; then
  sed -n 2,18p "$0"
  exit 2
fi
bench=$1 sft=$2 phase=$3
shift 3
root=$(cd "$(dirname "$0")/.." && pwd)
common=(--out "$bench" --samples 4 --curriculum pass-rate --curriculum-tasks "${CURRICULUM_TASKS:-64}"
  --rl-tag gpu --rl-recipe recipes/smollm2/learning/trloo_gpu.yaml --eval-set client=transformers env_device=cuda dtype=bfloat16 env_workers=12
  generation_batch=128 overlap=false env_time_reference_compile=false)
python3 - "$bench/stages.json" "$sft" <<'PY'  # the SFT choice, at its path on this machine
import json, sys
from pathlib import Path
path, model = Path(sys.argv[1]), sys.argv[2]
stages = json.loads(path.read_text())
chosen = stages["select_sft"]
if chosen["chosen"] != model:
    chosen.setdefault("chosen_on_cpu_box", chosen["chosen"])
    chosen["chosen"] = model
    path.write_text(json.dumps(stages, indent=1))
PY
case $phase in
  curriculum) python3 "$root/benchmarks/learning.py" "${common[@]}" --only curriculum ;;
  rl) bash "$root/benchmarks/learning_gpu_rl.sh" "$sft" "$bench/curriculum/data.parquet" "$bench/rl_run" "$@" ;;
  evaluate)
    stages=("$@")
    [ ${#stages[@]} -gt 0 ] || stages=(rl select_rl eval_sft eval_rl)
    python3 "$root/benchmarks/learning.py" "${common[@]}" --rl-from "$bench/rl_run" --only "${stages[@]}" ;;
  *) echo "phase: curriculum, rl or evaluate, not $phase" >&2; exit 2 ;;
esac
