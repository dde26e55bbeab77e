#!/usr/bin/env bash
# Issue 27 item 4: the cluster model's environment part against RayPool on real GPUs, in one
# device call: the bundled suite on new kernels through RayPool (one evaluation actor per GPU of a
# local Ray, sized as LocalPool on this host) on 1 GPU, then on every GPU of the machine when it
# has more than one. Ray is not installed on the device machine: RAY_TARBALL names a .tar.xz of a
# site-packages folder holding ray and its dependencies, built for the machine's Python (3.12)
# with the parts a RayPool does not use left out, so that it can travel with the working tree:
#   pip download --no-deps --only-binary=:all: --python-version 3.12 \
#     --platform manylinux2014_x86_64 -d whl ray==2.60.0 msgpack protobuf jsonschema \
#     referencing rpds-py jsonschema-specifications attrs click
#   mkdir site && for w in whl/*.whl; do python -m zipfile -e "$w" site; done
#   rm -rf site/ray/{jars,rllib,tune,train,data,llm,air,serve,dashboard/client/build}
#   tar -cf - -C site . | xz -6 > .raycarry/ray312.tar.xz   # ~29 MB
# Run from the repository root (or a copy of it) with OUT set:
#   OUT=runs/gpu RAY_TARBALL=.raycarry/ray312.tar.xz bash benchmarks/gpu_ray_pool.sh 3
set -u
REPEATS=${1:-3}
mkdir -p /opt/kr && ln -sfn "$PWD" /opt/kr/kernelrl
SITE=/tmp/ray-site
if [ -n "${RAY_TARBALL:-}" ]; then
  mkdir -p "$SITE" && tar -xJf "$RAY_TARBALL" -C "$SITE"
  chmod +x "$SITE"/ray/core/src/ray/*/* "$SITE"/bin/* 2>/dev/null  # a wheel unpacked by zipfile loses them
fi
export PYTHONPATH=/opt/kr:$SITE PYTHONUNBUFFERED=1 KERNELRL_CACHE=${KERNELRL_CACHE:-/tmp/kernelrl-cache-gpu}
GPUS=$(nvidia-smi -L | wc -l)
{ nvidia-smi -L; nproc; free -g | head -2; git log -1 --format=%H 2>/dev/null
  python -c "import torch, triton, ray; print(torch.__version__, triton.__version__, ray.__version__)"; } > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
COUNTS="1"; [ "$GPUS" -gt 1 ] && COUNTS="1 $GPUS"
cold=()
for n in $COUNTS; do
  python benchmarks/env_throughput.py --device cuda --pool ray --workers "$n" --new-kernels \
      --repeats "$REPEATS" "${cold[@]}" --json-out "$OUT/ray_${n}gpu.jsonl" \
      --summary-out "$OUT/ray_${n}gpu.json" > "$OUT/ray_${n}gpu.txt" 2>&1
  echo "ray ${n} GPU(s) rc=$?"
  grep -E "throughput:|evaluations in|spread:|host CPU|GPU held|pool:" "$OUT/ray_${n}gpu.txt"
  cold=(--skip-cold)  # reference timings are cached from the first run on
done
gzip -f "$OUT"/ray_*gpu.jsonl
