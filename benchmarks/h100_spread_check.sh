#!/usr/bin/env bash
# Issue 27, second call: the six tasks whose speedup spread exceeded 1.03 in the first call,
# 5 new kernels each, (A) sized pool with every child paused during a measurement, then
# (B) the old 4 slots + 8 spares, same settings. Run with OUT set, from the repository root.
export PYTHONUNBUFFERED=1 KERNELRL_CACHE=/tmp/kernelrl-cache-spread
T="09_sum_of_squares 11_rmsnorm 13_l2_normalize 19_matmul_fp16 25_cross_entropy 26_mse_loss"
timeout 100 python benchmarks/env_throughput.py --device cuda --repeats 5 --new-kernels --tasks $T \
    --json-out "$OUT/spread_sized.jsonl" > "$OUT/spread_sized.txt" 2>&1
grep -E "throughput:|evaluations in|spread|pool:" "$OUT/spread_sized.txt"
timeout 68 python benchmarks/env_throughput.py --device cuda --repeats 5 --new-kernels --tasks $T \
    --skip-cold --per-gpu 4 --spares 8 --json-out "$OUT/spread_4x8.jsonl" > "$OUT/spread_4x8.txt" 2>&1
grep -E "throughput:|evaluations in|spread|pool:" "$OUT/spread_4x8.txt"
