#!/usr/bin/env bash
# Builds the GPU bundle that scripts/gpu_check.py unpacks onto PYTHONPATH on the GPU machine (no network there; its
# image has torch 2.11.0+cu130, transformers 5.17, lightning, peft, nvidia-ml-py, Python 3.12, and no vLLM):
#   - vLLM 0.26.0, the release built for torch 2.11.0 / CUDA 13 (pip download vllm==0.26.0 --no-deps: 304 MB), without
#     the kernels a dense bf16 model does not run: FlashAttention 2/3/4 (vllm_flash_attn/_vllm_fa*_C, 458 MB, and
#     cute/, which needs the CuTe DSL), MoE (_moe_C), MLA (_flashmla*), qutlass, the vllm-rs binary, and the vendored
#     DeepGEMM and SM100 FMHA (third_party/deep_gemm, fmha_sm100: FP8 MoE and Blackwell). The rest of third_party/
#     stays: vLLM's CUDA platform check imports its own pynvml from there (without it vLLM finds no CUDA platform).
#     Without the FlashAttention kernels two files are replaced (scripts/gpu_bundle_check.py --shim writes them):
#     vllm_flash_attn/__init__.py imports cleanly (0.26 imports it on every model's path, via fa_utils) and refuses
#     only a call; v1/attention/backends/flash_attn.py raises ImportError, which vLLM's backend selection reads as
#     "FLASH_ATTN unavailable", so every engine (tokenrl's, TRL's) takes the Triton attention backend. The kernel
#     library keeps only what an sm_90 GPU (H100, H200) loads (scripts/fatbin_keep_arch.py) and no symbol table;
#   - the packages vLLM imports that the image lacks (found by importing vLLM from this stripped tree in a Python 3.12
#     venv holding the image's packages; the GPU-kernel packages it declares — flashinfer, tilelang, cutlass-dsl,
#     quack, humming, tokenspeed-mla, torchcodec, fastsafetensors — and the OpenAI server's — fastapi extras, mcp,
#     anthropic, opentelemetry — are left out: vLLM imports them lazily);
#   - TRL (the side-by-side benchmark) and tokenrl's own requirements the image lacks (hydra-core, omegaconf,
#     antlr4, math-verify, datasets, gguf).
# All installed for CPython 3.12 / manylinux x86_64 into one folder, packed as .cache/gpu/vllm-0.26.0-bundle.tar.xz
# (ignored by git; must stay under ~56 MiB: the device tool carries 64 MiB with the working tree and the GSM8K files).
# Every build ends with the check below. Usage:
#   bash scripts/gpu_vllm_bundle.sh                # builds (downloads once into .cache/gpu/dl), checks, prints the size
#   bash scripts/gpu_vllm_bundle.sh --check [TAR]  # the check alone: a clean Python 3.12 venv holding the GPU image's
#       versions (torch 2.11.0+cu130 without a GPU, transformers 5.17.0, lightning, peft, nvidia-ml-py: made once in
#       .cache/gpu/check-env) imports the unpacked bundle under vLLM's CUDA platform with a faked H200's NVML:
#       everything a Qwen2 / Llama run imports (scripts/gpu_bundle_check.py); exit 1 names each break
#   bash scripts/gpu_vllm_bundle.sh --data DIR     # packs DIR/gsm8k (the headline's task, for the GPU machine: no hub
#       there) into .cache/gpu/gsm8k.tar.xz; DIR is a local benchmark folder (TOKENRL_DATA_DIR)
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=.cache/gpu/vllm-0.26.0-bundle.tar.xz
DL=.cache/gpu/dl
CHECK_ENV=.cache/gpu/check-env
CHECK_PY=${CHECK_PY:-python3.12}
# the GPU image's packages that a run imports, at its versions where known (torch's own CUDA wheel from PyPI, as the
# image has it); what the bundle must bring is what this list lacks
CHECK_REQS=(torch==2.11.0 torchvision==0.26.0 transformers==5.17.0 lightning==2.6.6 torchmetrics peft nvidia-ml-py
  requests urllib3 pillow cloudpickle psutil pyyaml tqdm sentencepiece tiktoken aiohttp pyarrow pandas xxhash
  prometheus-client einops scipy protobuf tensorboard uvloop msgpack py-cpuinfo opencv-python-headless)

check() {  # check TAR: unpack it into a temporary site and import it as a Qwen2 run on an H200 would
  local tar=$1 site
  [ -f "$tar" ] || { echo "gpu_vllm_bundle: no bundle at $tar (build it: bash scripts/gpu_vllm_bundle.sh)" >&2; exit 2; }
  local want; want=$(printf '%s\n' "${CHECK_REQS[@]}" | sha256sum | cut -c1-16)
  if [ "$(cat "$CHECK_ENV/.stamp" 2>/dev/null)" != "$want" ]; then
    "$CHECK_PY" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 12))' 2>/dev/null \
      || { echo "gpu_vllm_bundle: the check needs Python 3.12 (the GPU image's): set CHECK_PY=/path/to/python3.12" >&2; exit 2; }
    rm -rf "$CHECK_ENV"
    "$CHECK_PY" -m venv "$CHECK_ENV"
    "$CHECK_ENV/bin/python" -m pip install -q "${CHECK_REQS[@]}"
    echo "$want" > "$CHECK_ENV/.stamp"
  fi
  site=$(mktemp -d /tmp/tokenrl-gpu-bundle-check.XXXXXX)
  tar -xJf "$tar" -C "$site"
  local rc=0
  "$CHECK_ENV/bin/python" scripts/gpu_bundle_check.py --site "$site" || rc=$?
  rm -rf "$site"
  return $rc
}

case "${1:-}" in
  --check) check "${2:-$OUT}"; exit ;;
  --data)
    mkdir -p .cache/gpu
    tar -C "${2:?--data DIR: a folder holding gsm8k/train.jsonl and gsm8k/test.jsonl}" -cf - gsm8k/train.jsonl \
      gsm8k/test.jsonl | xz -9 > .cache/gpu/gsm8k.tar.xz
    ls -l .cache/gpu/gsm8k.tar.xz | awk '{printf "%s: %.1f MiB\n", $NF, $5 / 1048576}'
    exit ;;
  "") ;;
  *) echo "usage: bash scripts/gpu_vllm_bundle.sh [--check [TAR] | --data DIR]" >&2; exit 2 ;;
esac
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
# tokenrl's requirements (requirements.txt pins), TRL (the side-by-side benchmark) and Liger-Kernel (the LM-head
# comparison: scripts/bench/lm_head.py --liger), where the image lacks them
PROJECT_DEPS=(
  hydra-core==1.3.8 omegaconf==2.3.1 math-verify==0.9.0 latex2sympy2_extended==1.11.0
  datasets==5.2.0 dill==0.4.1 multiprocess==0.70.19 trl==1.16.0 liger-kernel==0.8.5
)
SDIST_ONLY=(antlr4-python3-runtime==4.9.3)  # no wheel on PyPI: built here (pure python)

[ -f "$DL/vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl" ] || "$PY" -m pip download -q vllm==0.26.0 --no-deps -d "$DL"
SITE="$STAGE/site"
WHEEL="$PWD/$DL/vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl"
mkdir -p "$SITE"
(cd "$SITE" && unzip -q "$WHEEL" -x 'vllm/vllm_flash_attn/_vllm_fa*' 'vllm/vllm_flash_attn/cute/*' \
  'vllm/third_party/deep_gemm/*' 'vllm/third_party/fmha_sm100/*' 'vllm/vllm-rs' \
  'vllm/_moe_C*' 'vllm/_flashmla*' 'vllm/_qutlass_C*')
"$PY" scripts/gpu_bundle_check.py --shim "$SITE"
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
check "$OUT"
