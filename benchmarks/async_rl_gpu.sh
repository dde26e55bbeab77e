#!/usr/bin/env bash
# Synchronous against asynchronous RL on one GPU, on the learning benchmark's recipe
# (recipes/smollm2/learning/trloo_gpu.yaml), from an SFT model that writes kernels:
#
#   bash benchmarks/async_rl_gpu.sh BENCH_DIR SEED OUT [STEPS] [ARMS...]
#
# BENCH_DIR: a prepared folder of the learning benchmark (learning.py --stop-after synth, as for
# benchmarks/learning_seed.sh), one fresh copy. SEED: the SFT seed (the RL arms use SEED + 100).
# Runs, in order, each skipped when its output is already there (a later call continues):
# SFT (sft_gpu.yaml, one epoch, its final checkpoint) and the curriculum (train tasks beyond the
# reference tier), then benchmarks/async_rl.py --launcher train for the ARMS (default: sync
# async_s1 async_s2), STEPS steps each (default 6) from that SFT model. The environment runs
# on the host's cores (env_device cpu): on the policy's GPU it would time kernels beside
# generation, which the asynchronous mode refuses. It runs in a process of its own
# (env_pool process): its slots in the trainer's process would share the interpreter lock with
# generation. Every arm judges alike. The table over every arm run so far goes to
# OUT/results.md.
set -euo pipefail
if [ $# -lt 3 ]; then
  sed -n 2,15p "$0"
  exit 2
fi
bench=$1 seed=$2 out=$3 steps=${4:-6}
shift $(($# < 4 ? $# : 4))
arms=("$@")
[ ${#arms[@]} -gt 0 ] || arms=(sync async_s1 async_s2)
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
python3 benchmarks/learning.py --out "$bench" --samples 4 --run-seed "$seed" \
  --curriculum beyond-references --sft-candidates final \
  --sft-recipe recipes/smollm2/learning/sft_gpu.yaml --only sft select_sft curriculum
sft=$(python3 -c 'import json, sys; print(json.load(open(sys.argv[1]))["select_sft"]["chosen"])' \
  "$bench/stages.json")
python3 benchmarks/async_rl.py --launcher train --config recipes/smollm2/learning/trloo_gpu.yaml \
  --steps "$steps" --out "$out" --arms "${arms[@]}" -- \
  --model_name_or_path "$sft" --tasks "parquet:$bench/curriculum/data.parquet" \
  --seed $((seed + 100)) --env_pool process --env_device cpu --env_workers 8 --save_rollouts true
