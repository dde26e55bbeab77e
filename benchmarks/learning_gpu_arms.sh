#!/usr/bin/env bash
# RL variants of the learning benchmark side by side on a machine of several GPUs, one variant
# per GPU, each process on its GPU's share of the host's cores (benchmarks/learning_gpu.sh does
# the work of each):
#
#   bash benchmarks/learning_gpu_arms.sh BENCH_DIR SFT_MODEL rl VARIANT... [-- kernelrl train args]
#   bash benchmarks/learning_gpu_arms.sh BENCH_DIR SFT_MODEL evaluate VARIANT...
#   bash benchmarks/learning_gpu_arms.sh BENCH_DIR SFT_MODEL|- all VARIANT... [-- kernelrl train args]
#
# VARIANT: TAG, or TAG:KEY=VALUE,KEY=VALUE (recipe overrides); the recipe's own settings first,
# e.g. `gpu gpu_lr6e4:learning_rate=6e-4`. rl: each variant's RL run. evaluate: each variant's
# checkpoints validated and chosen on its GPU (select_rl); the variant chosen on validation
# (select_variant); then the held-out sweeps of the SFT model and of that variant's checkpoint
# side by side, and the base model's after SFT's, or beside both on a third GPU: its answers
# sampled on the CPU box judged here where BENCH_DIR/generated/eval_base.jsonl holds them
# (learning.py --replay), else sampled here; a variant whose RL or validation failed is left
# out of the choice. all: rl then evaluate, after SFT and its choice here when SFT_MODEL is -
# (learning_gpu.sh sft). CURRICULUM, as for learning_gpu.sh. Logs: BENCH_DIR/logs/gpu<i>_<what>.log.
set -euo pipefail
if [ $# -lt 4 ]; then
  sed -n 2,18p "$0"
  exit 2
fi
bench=$1 sft=$2 phase=$3
shift 3
here=$(cd "$(dirname "$0")" && pwd)
tags=() sets=() train_args=()
while [ $# -gt 0 ]; do
  if [ "$1" = "--" ]; then
    shift
    train_args=("$@")
    break
  fi
  tags+=("${1%%:*}")
  if [[ $1 == *:* ]]; then sets+=("$(tr , ' ' <<< "${1#*:}")"); else sets+=(""); fi
  shift
done
gpus=$(nvidia-smi -L | wc -l)
if [ "${#tags[@]}" -gt "$gpus" ]; then
  echo "${#tags[@]} variants but $gpus GPU(s): one variant per GPU" >&2
  exit 2
fi
read -r -a cores <<< "$(python3 -c 'import os; print(*sorted(os.sched_getaffinity(0)))')"
share=$((${#cores[@]} / gpus))  # 0: fewer cores than GPUs, nothing pinned
mkdir -p "$bench/logs"

on_gpu() {  # on_gpu GPU TAG SETTINGS LOG ARGS...: learning_gpu.sh ARGS on one GPU and its cores
  local gpu=$1 tag=$2 settings=$3 log=$4
  shift 4
  local pin=()
  if [ "$share" -gt 0 ] && command -v taskset > /dev/null; then
    pin=(taskset -c "$(tr ' ' , <<< "${cores[*]:gpu * share:share}")")
  fi
  CUDA_VISIBLE_DEVICES=$gpu RL_TAG=$tag RL_SET=$settings ${pin[@]+"${pin[@]}"} \
    bash "$here/learning_gpu.sh" "$bench" "$sft" "$@" > "$bench/logs/gpu${gpu}_$log.log" 2>&1
}

chosen_in() {  # chosen_in STAGE: what the stage chose, from stages.json
  python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))[sys.argv[2]]["chosen"])' \
    "$bench/stages.json" "$1"
}

wait_all() {  # wait for every background job; fail if one failed, after all have ended
  local status=0
  for job in $(jobs -p); do wait "$job" || status=$?; done
  return $status
}

train() {  # each variant's RL run; the checkpoints stay in BENCH_DIR, nothing is packed to $OUT
  if [ "${CURRICULUM:-pass-rate}" != difficulty ]; then  # the variants' shared train tasks first
    on_gpu 0 "${tags[0]}" "" curriculum curriculum
  fi
  for i in "${!tags[@]}"; do
    OUT='' on_gpu "$i" "${tags[$i]}" "${sets[$i]}" "rl_${tags[$i]}" rl \
      ${train_args[@]+"${train_args[@]}"} &
  done
  wait_all
}

evaluate() {  # validation per variant, the choice among those validated, the held-out sweeps
  for i in "${!tags[@]}"; do
    on_gpu "$i" "${tags[$i]}" "${sets[$i]}" "select_${tags[$i]}" evaluate rl select_rl &
  done
  wait_all || echo "a variant was not validated (its log in $bench/logs); choosing among the others" >&2
  RL_VARIANTS="${tags[*]}" on_gpu 0 "${tags[0]}" "" select_variant evaluate select_variant
  local chosen settings rl_gpu
  chosen=$(chosen_in select_variant)
  for i in "${!tags[@]}"; do [ "${tags[$i]}" = "$chosen" ] && settings=${sets[$i]}; done
  rl_gpu=$((gpus > 1 ? 1 : 0)) base_gpu=$((gpus > 2 ? 2 : 0))
  local base=(eval_base)  # the CPU box's answers judged here, else the base model sampled here
  if [ -f "$bench/generated/eval_base.jsonl" ]; then base+=(--replay); fi
  sweep_base() { on_gpu "$base_gpu" "$chosen" "$settings" eval_base evaluate "${base[@]}"; }
  if [ "$base_gpu" -eq 0 ]; then  # after SFT's sweep on its GPU, else on a GPU of its own
    { on_gpu 0 "$chosen" "$settings" eval_sft evaluate eval_sft && sweep_base; } &
  else
    on_gpu 0 "$chosen" "$settings" eval_sft evaluate eval_sft &
    sweep_base &
  fi
  if [ "$rl_gpu" -eq 0 ]; then wait_all; fi
  on_gpu "$rl_gpu" "$chosen" "$settings" eval_rl evaluate eval_rl &
  wait_all
}

case $phase in
  rl) train ;;
  evaluate) evaluate ;;
  all)
    if [ "$sft" = - ]; then  # SFT here (GPU 0), its candidates validated on every GPU, then RL
      SWEEP_GPUS=$(seq -s ' ' 0 $((gpus - 1))) bash "$here/learning_gpu.sh" "$bench" - sft \
        > "$bench/logs/gpus_sft.log" 2>&1
      sft=$(chosen_in select_sft)
    fi
    train || echo "a variant's RL failed (its log in $bench/logs); evaluating the others" >&2
    evaluate ;;
  *) echo "phase: rl, evaluate or all, not $phase" >&2; exit 2 ;;
esac
