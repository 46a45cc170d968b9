#!/usr/bin/env bash
# Builds the GPU bundle that scripts/gpu_check.py unpacks onto PYTHONPATH on the GPU machine (no network there; its
# image has torch 2.11.0+cu130, transformers 5.17, lightning, peft, Python 3.12, and no vLLM):
#   - vLLM 0.26.0, the release built for torch 2.11.0 / CUDA 13 (pip download vllm==0.26.0 --no-deps: 304 MB), without
#     its FlashAttention 2/3 kernels (vllm_flash_attn/_vllm_fa*_C), MoE (_moe_C), MLA (_flashmla*), qutlass kernels,
#     the vllm-rs binary and third_party/ headers: dense models on vLLM's Triton attention backend; its kernel
#     library keeps only what an sm_90 GPU (H100, H200) loads (scripts/fatbin_keep_arch.py) and no symbol table;
#   - the packages vLLM imports that the image lacks (found by importing vLLM from this stripped tree in a Python 3.12
#     venv holding the image's packages; the GPU-kernel packages it declares — flashinfer, tilelang, cutlass-dsl,
#     quack, humming, tokenspeed-mla, torchcodec, fastsafetensors — and the OpenAI server's — fastapi extras, mcp,
#     anthropic, opentelemetry — are left out: vLLM imports them lazily);
#   - TRL (the side-by-side benchmark) and tokenrl's own requirements the image lacks (hydra-core, omegaconf,
#     antlr4, math-verify, datasets, gguf).
# All installed for CPython 3.12 / manylinux x86_64 into one folder, packed as .cache/gpu/vllm-0.26.0-bundle.tar.xz
# (ignored by git; must stay under ~58 MiB: the device tool carries 64 MiB with the working tree). Usage:
#   bash scripts/gpu_vllm_bundle.sh            # builds (downloads once into .cache/gpu/dl) and prints the size
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=.cache/gpu/vllm-0.26.0-bundle.tar.xz
DL=.cache/gpu/dl
STAGE=$(mktemp -d /tmp/tokenrl-gpu-bundle.XXXXXX)
trap 'rm -rf "$STAGE"' EXIT
mkdir -p "$DL"
PY=${PYTHON:-python3}

# vLLM's packages the GPU image lacks, with vLLM 0.26.0's own bounds where its metadata has them
VLLM_DEPS=(
  "pydantic>=2.12" pydantic-core annotated-types typing-inspection
  msgspec cachetools cbor2 blake3 "pyzmq>=25" pybase64
  "openai>=2" jiter distro sniffio httpx2
  "openai-harmony>=0.0.3" partial-json-parser ijson setproctitle python-json-logger "depyf==0.20.0" astor
  "llguidance>=1.7,<1.8" "xgrammar>=0.2.1,<1" apache-tvm-ffi "outlines-core==0.2.14" "lark==1.2.2"
  "lm-format-enforcer==0.11.3" interegular "compressed-tensors==0.17.0" "mistral-common>=1.11.5"
  pydantic-extra-types pycountry "jsonschema>=4.23" jsonschema-specifications referencing rpds-py
  "fastapi>=0.133,<0.137" "starlette>=1.0.1" "prometheus-fastapi-instrumentator>=8" watchfiles
  "gguf==0.19.0"
)
# tokenrl's requirements (requirements.txt pins) and TRL (the side-by-side benchmark), where the image lacks them
PROJECT_DEPS=(
  hydra-core==1.3.8 omegaconf==2.3.1 math-verify==0.9.0 latex2sympy2_extended==1.11.0
  datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 trl==1.16.0
)
SDIST_ONLY=(antlr4-python3-runtime==4.9.3)  # no wheel on PyPI: built here (pure python)

[ -f "$DL/vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl" ] || "$PY" -m pip download -q vllm==0.26.0 --no-deps -d "$DL"
SITE="$STAGE/site"
WHEEL="$PWD/$DL/vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl"
mkdir -p "$SITE"
(cd "$SITE" && unzip -q "$WHEEL" -x 'vllm/vllm_flash_attn/_vllm_fa*' 'vllm/third_party/*' 'vllm/vllm-rs' \
  'vllm/_moe_C*' 'vllm/_flashmla*' 'vllm/_qutlass_C*')
# vLLM's kernels for the H100 / H200 only (sm_90 cubins, PTX up to sm_90), without the symbol tables: 76 MB → ~25 MB xz
strip --strip-unneeded "$SITE/vllm/_C_stable_libtorch.abi3.so"
"$PY" scripts/fatbin_keep_arch.py "$SITE/vllm/_C_stable_libtorch.abi3.so" --sm 90
PLATFORMS=()  # the GPU image's glibc is 2.39: every manylinux tag up to it
for n in 39 38 35 34 31 28 27 24 17; do PLATFORMS+=(--platform "manylinux_2_${n}_x86_64"); done
PLATFORMS+=(--platform manylinux2014_x86_64 --platform manylinux1_x86_64)
"$PY" -m pip install -q --no-deps --no-compile --only-binary=:all: --python-version 3.12 --implementation cp \
  --abi cp312 --abi abi3 --abi none "${PLATFORMS[@]}" --target "$SITE" "${VLLM_DEPS[@]}" "${PROJECT_DEPS[@]}"
"$PY" -m pip wheel -q --no-deps -w "$STAGE/wheels" "${SDIST_ONLY[@]}"
"$PY" -m pip install -q --no-deps --no-compile --target "$SITE" "$STAGE"/wheels/*.whl
rm -rf "$SITE"/bin
find "$SITE" -name __pycache__ -type d -prune -exec rm -rf {} +
du -sh "$SITE"
tar -C "$SITE" -cf - . | xz -T0 -9e > "$OUT.tmp" && mv "$OUT.tmp" "$OUT"
ls -l "$OUT" | awk '{printf "%s: %.1f MiB\n", $NF, $5 / 1048576}'
