#!/usr/bin/env bash
# The vLLM suite on a host with an NVIDIA GPU: vLLM's CUDA build (the `vllm` engine
# environment, deployments/engines/requirements/vllm.txt) serving the tiny Llama through
# Modelship. It is tests/test_vllm.py, the suite `make test` runs on vLLM's CPU build; where
# NVML sees a GPU it expects --enable-sleep-mode on the command line, an idle engine put to
# sleep (level 1) by the reaper and by make-room, and a wake on the next request, instead of
# the CPU build's "stopping instead". Then the recorded-stream replays.
#
# Run from the repository root after `make setup` (pip needs its index for the install, once):
#     bash scripts/gpu_check_vllm.sh [pytest options]
# Exit status: 2 where no GPU is seen, else pytest's.
set -euo pipefail
cd "$(dirname "$0")/.."

if ! .venv/bin/python -c 'import sys, pynvml; pynvml.nvmlInit(); sys.exit(pynvml.nvmlDeviceGetCount() == 0)' 2>/dev/null; then
    echo "gpu_check_vllm: NVML sees no GPU on this host; nothing to check" >&2
    exit 2
fi
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true

export MSHIP_ENGINE_ENVS_DIR="${MSHIP_ENGINE_ENVS_DIR:-$PWD/var/engines}"
.venv/bin/python manage.py engine_env install vllm
MSHIP_TEST_HEAVY=1 MSHIP_Q_NAME=modelship-gpu-check \
    .venv/bin/python -m pytest -q -p no:cacheprovider tests/test_vllm.py tests/test_vllm_streams.py "$@"
