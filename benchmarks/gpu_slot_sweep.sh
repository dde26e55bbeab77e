#!/usr/bin/env bash
# Slots and spares per GPU, side by side in one device call: the bundled suite's cold pass fills
# the reference-timing cache once, then each "SLOTS:SPARES" setting runs the suite warm on new
# kernels (REPEATS repeats, a fresh pool each). The settings the pool's sizing should pick.
# Run from the repository root (or a copy of it) with OUT set:
#   OUT=runs/gpu bash benchmarks/gpu_slot_sweep.sh 3 8:16 12:12 16:8
set -u
REPEATS=$1; shift
mkdir -p /opt/kr && ln -sfn "$PWD" /opt/kr/kernelrl
export PYTHONPATH=/opt/kr PYTHONUNBUFFERED=1 KERNELRL_CACHE=${KERNELRL_CACHE:-/tmp/kernelrl-cache-gpu}
{ nvidia-smi -L; nproc; free -g | head -2; git log -1 --format=%H 2>/dev/null
  python -c "import torch, triton; print(torch.__version__, triton.__version__)"; } > "$OUT/machine.txt" 2>&1
python benchmarks/env_throughput.py --device cuda --new-kernels --repeats 1 > "$OUT/cold.txt" 2>&1
grep -E "evaluations in" "$OUT/cold.txt"
for setting in "$@"; do
  slots=${setting%%:*} spares=${setting##*:}
  python benchmarks/env_throughput.py --device cuda --new-kernels --skip-cold --repeats "$REPEATS" \
      --per-gpu "$slots" --spares "$spares" --summary-out "$OUT/summary_$slots-$spares.json" \
      > "$OUT/warm_$slots-$spares.txt" 2>&1
  echo "== $slots slots, $spares spares (rc=$?)"
  grep -E "pool:|evaluations in|host CPU|GPU held|spread:|\`(child_wait|child_correctness|compare|gpu_wait|gpu_exclusive|total)\`" "$OUT/warm_$slots-$spares.txt"
done
