"""`bash scripts/gpu_vllm_bundle.sh --check` catches the two breaks the GPU found in the bundle of 2026-11-28 (issue
#46), and passes on the bundle as built now. It imports the real vLLM 0.26.0 of the bundle in the GPU image's versions
(torch 2.11.0+cu130 without a GPU, transformers 5.17.0) under vLLM's CUDA platform with NVML faked as one H200.

It needs what the bundle's build leaves in .cache/gpu (the bundle, the downloaded wheel and the check's venv: about
5 GB, built by `bash scripts/gpu_vllm_bundle.sh`); without them it skips, saying so. The old-way bundles are the built
one with what the old build did: vllm/third_party/ dropped (break 1), and vLLM's own FlashAttention package entry and
backend module in place of the stand-ins with its kernels still absent (break 2)."""

from __future__ import annotations

import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.conftest import ROOT

GPU = ROOT / ".cache" / "gpu"
BUNDLE = GPU / "vllm-0.26.0-bundle.tar.xz"
WHEEL = GPU / "dl" / "vllm-0.26.0-cp38-abi3-manylinux_2_28_x86_64.whl"
CHECK_PYTHON = GPU / "check-env" / "bin" / "python"

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        not (BUNDLE.is_file() and WHEEL.is_file() and CHECK_PYTHON.is_file()),
        reason="the GPU bundle is not built here (bash scripts/gpu_vllm_bundle.sh: 5 GB of downloads)",
    ),
]


def check(site: Path, *only: str) -> tuple[int, str]:
    done = subprocess.run(
        [str(CHECK_PYTHON), "scripts/gpu_bundle_check.py", "--site", str(site), "--only", *only],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=900,
    )
    return done.returncode, done.stdout


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("bundle")
    subprocess.run(["tar", "-xJf", str(BUNDLE), "-C", str(folder)], check=True)
    return folder


def test_the_bundle_as_built_imports_what_a_qwen2_run_on_an_h200_imports(site):
    status, out = check(site, "platform", "flash_attn", "backend", "registry", "engine", "kernels", "tokenrl")
    assert status == 0, out
    assert "PASS  platform   NvmlCudaPlatform DeviceCapability(major=9, minor=0)" in out
    assert "triton_attn" in next(line for line in out.splitlines() if line.startswith("PASS  backend"))


def test_it_catches_a_bundle_without_third_party(site):
    """Break 1: vLLM's CUDA platform check imports vllm.third_party.pynvml."""
    third_party, aside = site / "vllm" / "third_party", site / "third_party.aside"
    third_party.rename(aside)
    try:
        status, out = check(site, "platform")
    finally:
        aside.rename(third_party)
    assert status == 1 and "FAIL  platform" in out and "vllm.third_party.pynvml" in out, out


def test_it_catches_vllms_flash_attention_entry_without_its_kernels(site):
    """Break 2: 0.26's model path imports vllm.vllm_flash_attn, whose own __init__ raises without _vllm_fa2_C/_fa3_C;
    and with it importable, vLLM would select FLASH_ATTN for a run that has no kernels for it."""
    replaced = ["vllm/vllm_flash_attn/__init__.py", "vllm/v1/attention/backends/flash_attn.py"]
    shims = {name: (site / name).read_text() for name in replaced}
    with zipfile.ZipFile(WHEEL) as wheel:
        for name in replaced:
            (site / name).write_bytes(wheel.read(name))
    try:
        status, out = check(site, "flash_attn", "registry")
    finally:
        for name, text in shims.items():
            (site / name).write_text(text)
    assert status == 1, out
    assert "FAIL  flash_attn" in out and "requires the CUDA flash attention extensions" in out, out
    assert "FAIL  registry" in out, out


def test_the_build_writes_the_stand_ins(tmp_path):
    for name in ("vllm/vllm_flash_attn", "vllm/v1/attention/backends"):
        (tmp_path / name).mkdir(parents=True)
    subprocess.run([sys.executable, "scripts/gpu_bundle_check.py", "--shim", str(tmp_path)], cwd=ROOT, check=True)
    assert "raise ImportError" in (tmp_path / "vllm/v1/attention/backends/flash_attn.py").read_text()
    assert "FA2_AVAILABLE = FA3_AVAILABLE = False" in (tmp_path / "vllm/vllm_flash_attn/__init__.py").read_text()
