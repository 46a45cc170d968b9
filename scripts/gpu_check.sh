#!/usr/bin/env bash
# The ordered GPU verification: scripts/gpu_check.py (its docstring lists the steps). Each step < 10 min on one GPU,
# offline; results in benchmarks/gpu_check.json. Run it first whenever a GPU is at hand, and commit the file.
set -euo pipefail
cd "$(dirname "$0")/.."
exec python scripts/gpu_check.py "$@"
