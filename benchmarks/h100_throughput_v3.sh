#!/usr/bin/env bash
# Issue 27 in one device call (items 1-3): new-kernel throughput and speedup spread on the
# bundled suite, then KernelBench at published sizes, kernelrl's first repeat against
# KernelBench's in-process harness, in the same call. Run from the repository root (or a copy
# of it) with OUT set; KERNELBENCH_DIR=.../KernelBench and KERNELBENCH_SRC=.../src.
#   OUT=runs/v3 KERNELBENCH_DIR=KB/KernelBench KERNELBENCH_SRC=KB/src bash benchmarks/h100_throughput_v3.sh 520
set -u
LIMIT=${1:-520}
START=$(date +%s)
left() { echo $((LIMIT - ($(date +%s) - START))); }
export PYTHONUNBUFFERED=1 KERNELRL_CACHE=${KERNELRL_CACHE:-/tmp/kernelrl-cache-v3}
{ nvidia-smi -L; nproc; free -g | head -2; python -c "import torch, triton; print(torch.__version__, triton.__version__)"; } > "$OUT/machine.txt" 2>&1
timeout $(( $(left) - 200 )) python benchmarks/env_throughput.py --device cuda --repeats 5 --new-kernels \
    --json-out "$OUT/throughput.jsonl" --summary-out "$OUT/throughput_summary.json" > "$OUT/throughput.txt" 2>&1
echo "throughput rc=$? at $(( $(date +%s) - START )) s" | tee -a "$OUT/machine.txt"
grep -E "throughput:|evaluations in|spread:|host CPU|GPU held|pool:" "$OUT/throughput.txt"
KB_BUDGET=$(( $(left) - 25 ))
if [ "$KB_BUDGET" -gt 90 ] && [ -n "${KERNELBENCH_DIR:-}" ]; then
  timeout $(( KB_BUDGET + 15 )) python benchmarks/kernelbench_harness.py --kernelbench "$KERNELBENCH_DIR" \
      --kernelbench-src "$KERNELBENCH_SRC" --out /tmp/kb-v3 --repeats 1 --time-budget-s "$KB_BUDGET" \
      --phases kernelrl,kb-inproc --shares kernelrl=0.45,kb-inproc=0.55 > "$OUT/kb_harness.txt" 2>&1
  echo "kernelbench rc=$? at $(( $(date +%s) - START )) s" | tee -a "$OUT/machine.txt"
  cp /tmp/kb-v3/results.md "$OUT/kb_results.md"; cp /tmp/kb-v3/results.json "$OUT/kb_results.json"
  grep -E "evals/min|ratio|correct|OOM" "$OUT/kb_results.md"
fi
