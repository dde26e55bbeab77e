#!/usr/bin/env bash
# What fresh input contents on every timed call cost (issue 25's replay defence, issue 27's
# throughput and spread): the CPU cost of one refresh at the ReLU task's GPU size, then the
# tasks whose spread rose, 5 new kernels each, with fresh contents and with stale ones (the
# procedure before), in one call; then the test that a measurement has the GPU to itself.
# Run from the repository root with OUT set and kernelrl importable.
set -u
export PYTHONUNBUFFERED=1 KERNELRL_CACHE=/tmp/kernelrl-cache-fresh
T="01_relu 04_gated_residual 07_argmax_dim1 10_layernorm 13_l2_normalize 17_softmax_channels 18_matmul 24_depthwise_conv2d"
python - > "$OUT/refresh_cost.txt" 2>&1 <<'PY'
import time, types, torch
from kernelrl.env.sandbox import harness
module = types.ModuleType("relu"); module.get_inputs = lambda: [torch.randn(4096, 8192)]
device = torch.device("cuda")
timed = harness.TimedInputs(lambda s: harness.make_inputs(module, s, device), 1, 1)
for _ in range(50): timed.refresh(0)
torch.cuda.synchronize(); start = time.perf_counter()
for _ in range(500): timed.refresh(0)
cpu = time.perf_counter() - start; torch.cuda.synchronize(); wall = time.perf_counter() - start
print(f"refresh of a 4096x8192 fp32 input: {cpu / 500 * 1e6:.1f} us of CPU to enqueue, {wall / 500 * 1e6:.1f} us per refresh with the GPU")
PY
cat "$OUT/refresh_cost.txt"
for mode in fresh stale; do
  flag=""; [ "$mode" = stale ] && flag="--stale-inputs"
  timeout 150 python benchmarks/env_throughput.py --device cuda --repeats 5 --new-kernels --tasks $T $flag \
      --json-out "$OUT/spread_$mode.jsonl" > "$OUT/spread_$mode.txt" 2>&1
  echo "== $mode"; grep -E "throughput:|evaluations in|spread|GPU held" "$OUT/spread_$mode.txt"
done
timeout 90 python -m pytest -m gpu tests/env/test_gpu.py -q -p no:cacheprovider -k gpu_to_itself 2>&1 | tail -3
