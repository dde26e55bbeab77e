#!/usr/bin/env bash
# Issue 27 items 1-2 with the fork server, side by side in one device call: new-kernel
# throughput and speedup spread on the bundled suite with children forked from the fork server
# (5 repeats, pass 1 fills the reference-timing cache), then the same suite with children that
# each start their own interpreter (KERNELRL_SANDBOX_SPAWN=exec; fewer repeats, same cache;
# EXEC_REPEATS=0 skips it).
# Run from the repository root (or a copy of it) with OUT set:
#   OUT=runs/gpu bash benchmarks/gpu_fork_server.sh 570 2
set -u
LIMIT=${1:-570}
EXEC_REPEATS=${2:-2}
START=$(date +%s)
left() { echo $((LIMIT - ($(date +%s) - START))); }
mkdir -p /opt/kr && ln -sfn "$PWD" /opt/kr/kernelrl
export PYTHONPATH=/opt/kr PYTHONUNBUFFERED=1 KERNELRL_CACHE=${KERNELRL_CACHE:-/tmp/kernelrl-cache-gpu}
{ nvidia-smi -L; nproc; free -g | head -2; git log -1 --format=%H 2>/dev/null
  python -c "import torch, triton; print(torch.__version__, triton.__version__)"; } > "$OUT/machine.txt" 2>&1
timeout 120 python benchmarks/child_start_stress.py --device cuda --spare 16 --threads 8 --per-thread 6 \
    > "$OUT/stress.txt" 2>&1 || { echo "stress check failed"; head -c 6000 "$OUT/stress.txt"; exit 1; }
head -5 "$OUT/stress.txt"
# Every 30 s: the sandbox's processes, their age, state and kernel wait channel (a child stuck
# before its gate shows here).
( while sleep 30; do date +%T; ps -eo pid,ppid,stat,wchan:24,etimes,time,args --sort=etimes \
    | grep -E "sandbox|zygote|throughput" | grep -v grep | cut -c1-160; done ) > "$OUT/ps_watch.txt" 2>&1 &
WATCH=$!
trap 'kill $WATCH 2>/dev/null' EXIT
SPAWNS="fork_server"; [ "$EXEC_REPEATS" -gt 0 ] && SPAWNS="fork_server exec"
for spawn in $SPAWNS; do
  if [ "$spawn" = fork_server ]; then extra=(--repeats 5); else extra=(--repeats "$EXEC_REPEATS" --skip-cold); fi
  timeout $(( $(left) - 10 )) python benchmarks/env_throughput.py --device cuda --new-kernels --spawn "$spawn" \
      "${extra[@]}" --json-out "$OUT/throughput_$spawn.jsonl" --summary-out "$OUT/summary_$spawn.json" \
      > "$OUT/throughput_$spawn.txt" 2>&1
  echo "$spawn rc=$? at $(( $(date +%s) - START )) s" | tee -a "$OUT/machine.txt"
  grep -E "throughput:|evaluations in|spread:|host CPU|GPU held|pool:|cpu_seconds|import_" "$OUT/throughput_$spawn.txt"
done
