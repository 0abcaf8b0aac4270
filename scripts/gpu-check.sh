#!/usr/bin/env bash
# A GPU host, checked and measured: every step scripts/gpu_check.py lists (NVML against
# nvidia-smi and two num_gpus 0.5 deployments placed on one GPU; vLLM's CUDA build installed;
# the vLLM suite on CUDA with sleep mode and the KV offload across a sleep; vLLM's figures:
# start to ready, sleep level 1 and 2 wakes, the KV cache against the sequences said to fit,
# an out-of-memory start learned and recovered), then a table of the steps.
# Not part of `make test` (its --dry-run is). Run from the repository root after `make setup`:
#     bash scripts/gpu-check.sh [--dry-run] [--only NAME[,NAME]]
# Exit status: non-zero on any failure.
set -euo pipefail
cd "$(dirname "$0")/.."
exec .venv/bin/python scripts/gpu_check.py "$@"
