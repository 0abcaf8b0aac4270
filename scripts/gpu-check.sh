#!/usr/bin/env bash
# A GPU host, checked: what Modelship reads through NVML against nvidia-smi (devices, UUIDs,
# sizes), two simulated deployments of num_gpus 0.5 placed on one GPU and seeing only it, a
# table of each GPU (total, held by Modelship, used, free), then the vLLM suite on vLLM's CUDA
# build where NVML sees a GPU (scripts/gpu_check_vllm.sh; pass --no-vllm to leave it out).
# Not part of `make test`. Run from the repository root after `make setup`:
#     bash scripts/gpu-check.sh [--no-vllm]
# Exit status: non-zero on any mismatch or failure.
set -euo pipefail
cd "$(dirname "$0")/.."

export MSHIP_VAR_DIR="${MSHIP_VAR_DIR:-$(mktemp -d /tmp/modelship-gpu-check.XXXXXX)}"
.venv/bin/python manage.py migrate --noinput -v0
.venv/bin/python manage.py gpu_check --require-gpu --compare-nvidia-smi --place-demo
if [ "${1:-}" != "--no-vllm" ]; then
    bash scripts/gpu_check_vllm.sh
fi
echo "gpu-check: every check passed"
