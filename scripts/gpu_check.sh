#!/usr/bin/env bash
# The ordered GPU verification: scripts/gpu_check.py (its docstring lists the steps by call and the exact device
# calls). Three calls (--call 1|2|3) fit one 15-minute GPU window, offline; vLLM, TRL and the packages the GPU image
# lacks come from the bundle scripts/gpu_vllm_bundle.sh builds (carried to the machine). Commit the merged result.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=$(command -v python || command -v python3)
exec "$PY" scripts/gpu_check.py "$@"
