#!/bin/bash
# SFT and RL with DDP, DeepSpeed ZeRO-2 and ZeRO-3 on the GPU machine (one H100), in one command:
#   bash benchmarks/gpu_training.sh            # writes to $OUT (default runs/gpu/out)
# needs, carried beside the repository: .whl/ (trl, datasets, pydantic, hjson, ... wheels) and
# .gpu-train/ (DeepSpeed's source package, SmolLM2's tokenizer files). Steps:
#   (a) install the wheels and build DeepSpeed from source without its ops (timed);
#   (b)-(d) benchmarks/gpu_training.py: tiny model + SFT data, then per launch configuration
#       SFT, RL (TRLOO, transformers generation, environment pool on the same GPU), and each
#       resumed from its checkpoint; figures in $OUT/results.{json,md}, output in $OUT/logs.txt.
# TOTAL_S (default 505) bounds the whole script: stages that would not fit are skipped.
set -u -o pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-runs/gpu/out}
TOTAL_S=${TOTAL_S:-505}
WORK=${WORK:-/tmp/kernelrl-gpu}
mkdir -p "$OUT"
START=$(date +%s)
export PYTHONUNBUFFERED=1 HF_HUB_OFFLINE=1 KERNELRL_CACHE=${KERNELRL_CACHE:-/tmp/kernelrl-cache}
export TOKENIZERS_PARALLELISM=false
{
  echo "== machine"; nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader; nproc; python3 -V
  echo "== (a) install wheels"
  t=$(date +%s)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 3
  echo "wheels: $(( $(date +%s) - t )) s"
  # meanwhile, the environment's one-off costs (reference timings of the RL tasks, eager and
  # torch.compile, cached in $KERNELRL_CACHE) so that the first RL stage does not carry them
  ( mkdir -p /opt/kr && ln -sfn "$PWD" /opt/kr/kernelrl
    for task in 01_relu 02_gelu_tanh; do
      PYTHONPATH=/opt/kr:/tmp/site timeout 150 python3 -m kernelrl.launch.cli env check --device cuda \
          --task data/tasks/$task.py --solution data/solutions/triton/$task.py 2>&1 | tail -3
    done > "$OUT/warmup.txt" ) &
  WARM=$!
  t=$(date +%s)
  # DeepSpeed's setup imports torch (the machine's 2.11+cu130) and setuptools: no build isolation
  DS_BUILD_OPS=0 python3 -m pip install -q --no-index --no-deps --no-build-isolation --no-compile \
      --no-cache-dir --upgrade --target /tmp/site .gpu-train/deepspeed-0.19.8.tar.gz || exit 4
  echo "deepspeed build+install: $(( $(date +%s) - t )) s"
  t=$(date +%s); wait $WARM; echo "reference timings: waited $(( $(date +%s) - t )) s after the build"
} 2>&1 | tee "$OUT/setup.txt" || exit $?
cat "$OUT/warmup.txt" >> "$OUT/setup.txt" && rm -f "$OUT/warmup.txt"
mkdir -p /opt/kr && ln -sfn "$PWD" /opt/kr/kernelrl
export PYTHONPATH=/opt/kr:/tmp/site
python3 - <<'PY' 2>&1 | grep -v -i warn | tee -a "$OUT/setup.txt"
import importlib
for name in ("torch", "transformers", "accelerate", "trl", "deepspeed", "datasets", "pydantic", "peft"):
    try:
        module = importlib.import_module(name)
        print(f"{name} {module.__version__}")
    except Exception as exc:  # shown, then the stages say what broke
        print(f"{name}: {type(exc).__name__}: {exc}")
import torch
print("cuda", torch.version.cuda, torch.cuda.get_device_name())
PY
mkdir -p "$WORK"
python3 benchmarks/gpu_training.py prepare --tokenizer .gpu-train/smollm2-tok --work "$WORK" \
    > "$WORK/prepare.txt" 2>&1 || { tail -20 "$WORK/prepare.txt" | tee -a "$OUT/setup.txt"; exit 5; }
tail -1 "$WORK/prepare.txt" | tee -a "$OUT/setup.txt"
LEFT=$(( TOTAL_S - ($(date +%s) - START) ))
echo "== stages, $LEFT s left" | tee -a "$OUT/setup.txt"
python3 benchmarks/gpu_training.py run --work "$WORK" --out "$OUT" --deadline-s "$LEFT" "$@"
status=$?
cat "$OUT/results.md"
echo "total $(( $(date +%s) - START )) s, exit $status"
exit $status
