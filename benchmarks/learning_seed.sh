#!/usr/bin/env bash
# One run (one seed) of the pre-registered learning protocol (docs/learning-protocol.md) on a
# machine of one GPU, in one window:
#
#   bash benchmarks/learning_seed.sh BENCH_DIR SEED          # SFT -> held-out -> RL -> held-out -> KernelBench set
#   bash benchmarks/learning_seed.sh BENCH_DIR SEED base     # the base model: held-out sweep, KernelBench set
#
# BENCH_DIR: the prepared folder (learning.py --stop-after synth with --heldout-from and
# --kernelbench-set: stages.json, synth/tasks/train, sft_data/, tasks/{validation,heldout,
# kernelbench}/), one fresh copy per seed. SEED: the run's seed R (SFT R, RL R + 100, sweeps
# R + 200). In order, most important first, so that a window cut short loses the least:
# SFT (sft_gpu.yaml, one epoch; its final checkpoint, fixed before the run), the held-out
# sweep of that SFT model, the curriculum (train tasks beyond the reference tier), TRLOO
# (trloo_gpu.yaml: 15 steps, one checkpoint at step 15, a 660-s safety stop), the held-out
# sweep of that checkpoint (one candidate: no validation sweep, no choice), then the
# KernelBench set answered by RL and SFT (judged later, on the CPU box: learning.py --only
# judge_kb report). Every sweep runs here with the transformers client and the GPU
# environment. Logs: BENCH_DIR/logs/. Runs 1 and 2 saved step 10 too and validated both;
# docs/learning-protocol.md, "Deviations", says why that stopped and why it changes neither.
set -euo pipefail
if [ $# -lt 2 ]; then
  sed -n 2,20p "$0"
  exit 2
fi
bench=$1 seed=$2 phase=${3:-run}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
tag=protocol
common=(--out "$bench" --samples 4 --run-seed "$seed" --curriculum beyond-references
  --rl-tag "$tag" --rl-recipe recipes/smollm2/learning/trloo_gpu.yaml --sft-candidates final
  --eval-set client=transformers env_device=cuda dtype=bfloat16 env_workers=12 env_per_gpu=0
  generation_batch=128 overlap=false env_time_reference_compile=false)

chosen_sft() {
  python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["select_sft"]["chosen"])' \
    "$bench/stages.json"
}

case $phase in
  run)
    python3 benchmarks/learning.py "${common[@]}" --sft-recipe recipes/smollm2/learning/sft_gpu.yaml \
      --only sft select_sft eval_sft curriculum
    sft=$(chosen_sft)
    OUT='' bash benchmarks/learning_gpu_rl.sh "$sft" "$bench/curriculum/data.parquet" "$bench/rl_run_$tag" \
      --seed $((seed + 100)) --max_steps 15 --save_steps 15 --stop_after_s 660
    python3 benchmarks/learning.py "${common[@]}" --sft-model "$sft" --rl-from "$bench/rl_run_$tag" \
      --only rl select_rl eval_rl generate_kb ;;
  base)
    python3 benchmarks/learning.py "${common[@]}" --kb-base --only eval_base generate_kb ;;
  *) echo "phase: run or base, not $phase" >&2; exit 2 ;;
esac
