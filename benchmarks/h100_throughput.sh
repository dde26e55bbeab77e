#!/usr/bin/env bash
# Issue 27 in one device call (items 1-3): KernelBench at published sizes first, kernelrl's
# first repeat against KernelBench's in-process harness (KB_BUDGET seconds between them), then
# new-kernel throughput and speedup spread on the bundled suite with the time left. Run from the
# repository root (or a copy of it) with OUT set; KERNELBENCH_DIR=.../KernelBench and
# KERNELBENCH_SRC=.../src (KernelBench's eval.py needs pydantic: carry its wheels).
#   OUT=runs/h100 KERNELBENCH_DIR=KB/KernelBench KERNELBENCH_SRC=KB/src bash benchmarks/h100_throughput.sh 560 220
set -u
LIMIT=${1:-560}
KB_BUDGET=${2:-220}
START=$(date +%s)
left() { echo $((LIMIT - ($(date +%s) - START))); }
export PYTHONUNBUFFERED=1 KERNELRL_CACHE=${KERNELRL_CACHE:-/tmp/kernelrl-cache-h100}
{ nvidia-smi -L; nproc; free -g | head -2; git log -1 --format=%H 2>/dev/null
  python -c "import torch, triton; print(torch.__version__, triton.__version__)"; } > "$OUT/machine.txt" 2>&1
if [ -n "${KERNELBENCH_DIR:-}" ]; then
  timeout $(( KB_BUDGET + 40 )) python benchmarks/kernelbench_harness.py --kernelbench "$KERNELBENCH_DIR" \
      --kernelbench-src "$KERNELBENCH_SRC" --out /tmp/kb-h100 --repeats 1 --time-budget-s "$KB_BUDGET" \
      --phases kernelrl,kb-inproc --shares kernelrl=0.55,kb-inproc=0.45 > "$OUT/kb_harness.txt" 2>&1
  echo "kernelbench rc=$? at $(( $(date +%s) - START )) s" | tee -a "$OUT/machine.txt"
  cp /tmp/kb-h100/results.md "$OUT/kb_results.md"; cp /tmp/kb-h100/results.json "$OUT/kb_results.json"
  grep -E "evals/min|ratio|correct|OOM|incorrect|error|violation" "$OUT/kb_results.md"
fi
timeout $(( $(left) - 10 )) python benchmarks/env_throughput.py --device cuda --repeats 5 --new-kernels \
    --json-out "$OUT/throughput.jsonl" --summary-out "$OUT/throughput_summary.json" > "$OUT/throughput.txt" 2>&1
echo "throughput rc=$? at $(( $(date +%s) - START )) s" | tee -a "$OUT/machine.txt"
grep -E "throughput:|evaluations in|spread:|host CPU|GPU held|pool:" "$OUT/throughput.txt"
