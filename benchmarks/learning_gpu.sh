#!/usr/bin/env bash
# The learning benchmark's GPU stages on a GPU machine, after the CPU box ran synth, sft and
# select_sft (benchmarks/learning.py --stop-after select_sft), or synth alone:
#
#   bash benchmarks/learning_gpu.sh BENCH_DIR - sft
#   bash benchmarks/learning_gpu.sh BENCH_DIR SFT_MODEL curriculum
#   bash benchmarks/learning_gpu.sh BENCH_DIR SFT_MODEL rl [kernelrl train args, e.g. --stop_after_s N]
#   bash benchmarks/learning_gpu.sh BENCH_DIR SFT_MODEL evaluate [stages, default: rl select_rl eval_sft eval_rl]
#
# BENCH_DIR: the CPU box's benchmark folder (stages.json, synth/tasks/train, tasks/), copied
# here; SFT_MODEL: the checkpoint select_sft chose, on this machine. sft: SFT (sft_gpu.yaml) and
# its validation and choice here, on the references synth wrote. curriculum: the SFT model's
# pass rates on a sample of train tasks, keeping those it solves sometimes; rl: TRLOO on them
# (benchmarks/learning_gpu_rl.sh, resumable) into BENCH_DIR/rl_run_$RL_TAG; evaluate:
# validation and choice of RL's checkpoints, then held-out sweeps of the SFT model and the chosen
# checkpoint (add train_check: both again on RL's train tasks). Every sweep runs here with the
# transformers client and the GPU environment, so the stages it compares share one generator
# and one judge. The report is written on the CPU box: learning.py --out BENCH_DIR --only report.
#
# Environment: RL_TAG (default gpu) names the RL variant, RL_SET its recipe overrides
# ("learning_rate=6e-4 ..."), CURRICULUM pass-rate (default), difficulty (RL on the whole
# train split, filtered by the recipe's task_difficulty) or beyond-references (the train tasks
# longer than any reference solution; run the curriculum phase first), SWEEP_GPUS ("0 1": a
# choice's validation sweeps side by side, one per GPU, SFT on the first);
# benchmarks/learning_gpu_arms.sh runs variants side by side, one per GPU.
set -euo pipefail
if [ $# -lt 3 ]; then
  sed -n 2,25p "$0"
  exit 2
fi
bench=$1 sft=$2 phase=$3
shift 3
root=$(cd "$(dirname "$0")/.." && pwd)
tag=${RL_TAG:-gpu} curriculum=${CURRICULUM:-pass-rate}
read -r -a settings <<< "${RL_SET:-}"
common=(--out "$bench" --samples 4 --curriculum "$curriculum" --curriculum-tasks "${CURRICULUM_TASKS:-64}"
  --rl-tag "$tag" --rl-recipe recipes/smollm2/learning/trloo_gpu.yaml
  --eval-set client=transformers env_device=cuda dtype=bfloat16 env_workers=12 env_per_gpu=0
  generation_batch=128 overlap=false env_time_reference_compile=false)
if [ "$sft" != - ]; then common+=(--sft-model "$sft"); fi
if [ -n "${SWEEP_GPUS:-}" ]; then common+=(--sweep-gpus $SWEEP_GPUS); fi
case $curriculum in
  pass-rate | beyond-references) tasks=$bench/curriculum/data.parquet ;;
  difficulty) tasks=$bench/synth/tasks/train/data.parquet ;;
  *) echo "CURRICULUM: pass-rate, difficulty or beyond-references, not $curriculum" >&2; exit 2 ;;
esac
overrides=()
for setting in ${settings[@]+"${settings[@]}"}; do overrides+=("--${setting%%=*}" "${setting#*=}"); done
case $phase in
  sft) python3 "$root/benchmarks/learning.py" "${common[@]}" \
    --sft-recipe recipes/smollm2/learning/sft_gpu.yaml --only sft select_sft ;;
  curriculum) python3 "$root/benchmarks/learning.py" "${common[@]}" --only curriculum ;;
  rl) bash "$root/benchmarks/learning_gpu_rl.sh" "$sft" "$tasks" "$bench/rl_run_$tag" \
    ${overrides[@]+"${overrides[@]}"} "$@" ;;
  evaluate)
    stages=("$@")
    [ ${#stages[@]} -gt 0 ] || stages=(rl select_rl eval_sft eval_rl)
    python3 "$root/benchmarks/learning.py" "${common[@]}" --rl-from "$bench/rl_run_$tag" \
      ${settings[@]+--rl-set "${settings[@]}"} ${RL_VARIANTS:+--rl-variants $RL_VARIANTS} \
      --only "${stages[@]}" ;;
  *) echo "phase: sft, curriculum, rl or evaluate, not $phase" >&2; exit 2 ;;
esac
