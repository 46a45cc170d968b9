"""The GPU bundle (scripts/gpu_vllm_bundle.sh) imported as a Qwen2 / Llama run imports it on an H200, proved on a CPU.

    python scripts/gpu_bundle_check.py --site DIR     (with the GPU image's Python: gpu_vllm_bundle.sh --check)
    python scripts/gpu_bundle_check.py --shim DIR     (the build: writes the two files that stand in for FlashAttention)

`--site DIR` (an unpacked bundle) runs each check in a fresh process with DIR, src/ and this repository on PYTHONPATH
and vLLM's CUDA platform patched in. The machine has no GPU, so two things are stood in for: NVML, faked as one H200
(compute capability 9.0) at the one place vLLM reads it, its own `vllm.third_party.pynvml`; and the CUDA driver
(libcuda.so.1), a library compiled here that defines the driver functions the bundle's kernel libraries link against,
each returning CUDA_ERROR_NO_DEVICE, so the real libraries load and register their ops with the real torch 2.11+cu130.
Everything else is vLLM's real code. The checks, each named by what a GPU run would hit:

    platform   vLLM's CUDA platform is found (break 1 of issue #46: the bundle dropped vllm/third_party/)
    flash_attn `vllm.vllm_flash_attn` imports (break 2: 0.26 imports it on every model's path, via fa_utils)
    backend    the attention backend vLLM selects for Qwen2.5-0.5B's heads in bf16 imports, and it is TRITON_ATTN
    registry   the model registry's subprocess inspection of Qwen2ForCausalLM and LlamaForCausalLM
    engine     the engine's modules: LLM, the V1 engine core, the GPU worker and model runner, the sampler
    kernels    the kernel library cut to sm_90 (vllm._C_stable_libtorch) and the sleep-mode allocator load
    tokenrl    tokenrl's vLLM engine, the doctor and TRL import from the bundle

Prints one line per check; exit 1 if any failed. What it cannot prove here: that the kernels run (no GPU).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import textwrap
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

FLASH_ATTN_SHIM = '''\
"""tokenrl's GPU bundle: vLLM's FlashAttention package without its CUDA kernels (_vllm_fa2_C, _vllm_fa3_C: 458 MB,
over what the GPU machine receives). vLLM 0.26 imports this package on every model's path (fa_utils), so it must
import; a call into it is refused. The backend module vllm.v1.attention.backends.flash_attn raises ImportError in this
bundle, so vLLM's backend selection never picks FLASH_ATTN (scripts/gpu_vllm_bundle.sh)."""

FA2_AVAILABLE = FA3_AVAILABLE = False


def _absent(*args, **kwargs):
    raise RuntimeError("tokenrl's vLLM bundle carries no FlashAttention kernels: use the TRITON_ATTN backend")


compile_flash_attn_varlen_func_from_specs = flash_attn_varlen_func = get_scheduler_metadata = _absent


def is_fa_version_supported(fa_version: int) -> bool:
    return False


def fa_version_unsupported_reason(fa_version: int) -> str:
    return "tokenrl's vLLM bundle carries no FlashAttention kernels"
'''
FLASH_ATTN_BACKEND_SHIM = '''\
"""tokenrl's GPU bundle carries no FlashAttention kernels: vLLM's backend selection reads this ImportError as
"FLASH_ATTN unavailable" and takes the next backend (TRITON_ATTN; FlashInfer is not carried either)."""

raise ImportError("tokenrl's vLLM bundle carries no FlashAttention kernels (scripts/gpu_vllm_bundle.sh)")
'''
SHIMS = {
    "vllm/vllm_flash_attn/__init__.py": FLASH_ATTN_SHIM,
    "vllm/v1/attention/backends/flash_attn.py": FLASH_ATTN_BACKEND_SHIM,
}

# sitecustomize.py of every checked process (the registry's inspection runs in a subprocess of its own)
FAKE_H200 = '''\
"""NVML faked as one H200 where vLLM reads it (vllm.third_party.pynvml), patched in as that module is imported."""
import importlib.abc
import importlib.machinery
import sys
from types import SimpleNamespace


def _patch(nvml):
    gib = 1 << 30
    fake = {
        "nvmlInit": lambda *a: None,
        "nvmlShutdown": lambda *a: None,
        "nvmlDeviceGetCount": lambda: 1,
        "nvmlDeviceGetHandleByIndex": lambda index: index,
        "nvmlDeviceGetHandleByUUID": lambda uuid: 0,
        "nvmlDeviceGetIndex": lambda handle: 0,
        "nvmlDeviceGetCudaComputeCapability": lambda handle: (9, 0),
        "nvmlDeviceGetName": lambda handle: "NVIDIA H200",
        "nvmlDeviceGetUUID": lambda handle: "GPU-00000000-0000-0000-0000-000000000000",
        "nvmlDeviceGetMemoryInfo": lambda handle: SimpleNamespace(total=141 * gib, free=140 * gib, used=gib),
        "nvmlDeviceGetNumaNodeId": lambda handle: 0,
        "nvmlSystemGetDriverVersion": lambda: "580.159.04",
        "nvmlSystemGetCudaDriverVersion": lambda: 13000,
    }
    for name, value in fake.items():
        setattr(nvml, name, value)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname != "vllm.third_party.pynvml":
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is not None:
            run = spec.loader.exec_module
            spec.loader.exec_module = lambda module: (run(module), _patch(module))[0]
        return spec


sys.meta_path.insert(0, _Finder())
'''

CHECKS = {
    "platform": """
        from vllm.platforms import current_platform
        assert current_platform.is_cuda(), (
            f"vLLM found no CUDA platform ({type(current_platform).__name__}): its platform check imports "
            "vllm.third_party.pynvml; is vllm/third_party/ in the bundle?")
        print(type(current_platform).__name__, current_platform.get_device_capability())
    """,
    "flash_attn": """
        from vllm.platforms import current_platform
        import vllm.vllm_flash_attn
        import vllm.v1.attention.backends.fa_utils
        print("vllm.vllm_flash_attn imports")
    """,
    "backend": """
        import importlib, torch
        from vllm.platforms import current_platform
        from vllm.v1.attention.selector import AttentionSelectorConfig
        config = AttentionSelectorConfig(head_size=64, dtype=torch.bfloat16, kv_cache_dtype="auto", block_size=16)
        path = current_platform.get_attn_backend_cls(None, config, num_heads=14)
        module, _, name = path.rpartition(".")
        getattr(importlib.import_module(module), name)
        assert "triton_attn" in module, f"vLLM selects {path}, which this bundle cannot run (no FlashAttention kernels)"
        print(path)
    """,
    "registry": """
        from vllm.model_executor.models.registry import ModelRegistry
        for arch in ("Qwen2ForCausalLM", "LlamaForCausalLM"):
            info = ModelRegistry.models[arch].inspect_model_cls()  # in a subprocess of its own
            assert info.is_text_generation_model, arch
        print("Qwen2ForCausalLM, LlamaForCausalLM inspected")
    """,
    "engine": """
        import importlib, importlib.util
        modules = ["vllm", "vllm.v1.engine.core", "vllm.v1.worker.gpu_worker", "vllm.v1.worker.gpu_model_runner",
                   "vllm.v1.sample.sampler", "vllm.model_executor.models.qwen2", "vllm.model_executor.models.llama",
                   "vllm.v1.attention.backends.triton_attn"]
        if importlib.util.find_spec("vllm.v1.worker.gpu.model_runner"):
            modules.append("vllm.v1.worker.gpu.model_runner")  # the V2 model runner, GPUs' default in 0.26
        for name in modules:
            importlib.import_module(name)
        from vllm import LLM, SamplingParams
        print(len(modules), "modules")
    """,
    "kernels": """
        import torch
        import vllm._C_stable_libtorch, vllm.cumem_allocator, vllm._custom_ops
        from vllm.device_allocator.cumem import CuMemAllocator
        used = [torch.ops._C.rms_norm, torch.ops._C.fused_add_rms_norm, torch.ops._C.rotary_embedding,
                torch.ops._C.silu_and_mul, torch.ops._C_cache_ops.reshape_and_cache_flash]  # a Qwen2 layer's ops
        print(", ".join(str(op) for op in used), "registered")
    """,
    "tokenrl": """
        import tokenrl.rollout.vllm_engine, tokenrl.cli.doctor, trl, hydra, omegaconf, datasets, math_verify
        from trl import GRPOConfig, GRPOTrainer
        print("tokenrl", "trl", trl.__version__)
    """,
}


def version_of(site: Path) -> str:
    """The vLLM version of the unpacked bundle `site` (its dist-info)."""
    found = sorted(site.glob("vllm-*.dist-info"))
    return found[0].name.removeprefix("vllm-").removesuffix(".dist-info") if found else "unknown"


def write_shims(site: Path) -> None:
    """Replace vLLM's FlashAttention package entry and backend module in the unpacked bundle `site`."""
    for relative, text in SHIMS.items():
        target = site / relative
        if not target.parent.is_dir():
            raise SystemExit(f"gpu_bundle_check: {target.parent} missing: is {site} an unpacked vLLM 0.26 wheel?")
        target.write_text(text)


def stub_driver(site: Path, folder: Path) -> None:
    """`folder`/libcuda.so.1: every driver function the bundle's libraries link against, returning CUDA_ERROR_NO_DEVICE
    (100); Python loads extensions with RTLD_NOW, so each must be defined for the real libraries to load."""
    names = set()
    for library in (site / "vllm").glob("*.so"):
        needs = subprocess.run(["readelf", "-d", str(library)], capture_output=True, text=True, check=True).stdout
        if "libcuda.so.1" in needs:
            symbols = subprocess.run(
                ["nm", "-D", "--undefined-only", str(library)], capture_output=True, text=True, check=True
            ).stdout
            names |= {line.split()[-1].split("@")[0] for line in symbols.splitlines() if line.split()[-1][:2] == "cu"}
    source = folder / "libcuda_stub.c"
    source.write_text("".join(f"int {name}(void) {{ return 100; }}\n" for name in sorted(names)))
    subprocess.run(
        ["gcc", "-shared", "-fPIC", "-o", str(folder / "libcuda.so.1"), str(source), "-Wl,-soname,libcuda.so.1"],
        check=True,
    )


def run_checks(site: Path, names: list[str]) -> dict[str, tuple[bool, str]]:
    """Each check in a process of its own: (passed, the last line it printed or its error)."""
    results = {}
    with tempfile.TemporaryDirectory(prefix="tokenrl-fake-h200-") as fake:
        Path(fake, "sitecustomize.py").write_text(FAKE_H200)
        stub_driver(site, Path(fake))
        env = {
            **os.environ,
            "LD_LIBRARY_PATH": os.pathsep.join(filter(None, [fake, os.environ.get("LD_LIBRARY_PATH")])),
            "PYTHONPATH": os.pathsep.join([fake, str(site), str(ROOT / "src"), str(ROOT)]),
            "VLLM_CACHE_ROOT": str(Path(fake, "vllm-cache")),  # no cached model inspection: run it
            "HF_HUB_OFFLINE": "1",
            "VLLM_USE_FLASHINFER_SAMPLER": "0",
        }
        for name in names:
            done = subprocess.run(
                [sys.executable, "-c", textwrap.dedent(CHECKS[name])],
                env=env,
                capture_output=True,
                text=True,
                timeout=300,
                cwd=fake,
            )
            lines = (done.stdout if done.returncode == 0 else done.stderr).strip().splitlines()
            errors = [line for line in lines if "Error" in line or "error" in line]
            results[name] = (done.returncode == 0, (lines[-1] if done.returncode == 0 or not errors else errors[-1]))
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    where = parser.add_mutually_exclusive_group(required=True)
    where.add_argument("--site", type=Path, help="an unpacked bundle to check")
    where.add_argument("--shim", type=Path, help="an unpacked vLLM wheel to give the FlashAttention stand-ins")
    parser.add_argument("--only", nargs="+", choices=list(CHECKS), default=list(CHECKS))
    parser.add_argument("--out", type=Path, help="also write the results as JSON (machine, versions, date)")
    args = parser.parse_args()
    if args.shim:
        write_shims(args.shim)
        return 0
    results = run_checks(args.site, args.only)
    for name, (passed, line) in results.items():
        print(f"{'PASS' if passed else 'FAIL'}  {name:<10} {line}")
    failed = [name for name, (passed, _) in results.items() if not passed]
    if args.out:
        from importlib.metadata import version

        record = {
            "check": "gpu_bundle_check",
            "date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "machine": f"{platform.machine()}, {os.cpu_count()} CPUs, no GPU (NVML and the driver stood in for)",
            "versions": {name: version(name) for name in ("torch", "transformers", "triton")}
            | {"python": platform.python_version(), "vllm": version_of(args.site)},
            "results": {name: {"passed": passed, "line": line} for name, (passed, line) in results.items()},
        }
        args.out.write_text(json.dumps(record, indent=2) + "\n")
    print(f"gpu_bundle_check: {'FAILED: ' + ', '.join(failed) if failed else 'the bundle imports as a GPU run needs'}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
