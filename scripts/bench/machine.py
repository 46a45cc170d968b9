"""The machine a benchmark ran on: OS, logical CPUs, CPU model and the vector instruction sets that decide CPU
kernel speed (oneDNN picks AVX2, AVX-512, AVX512-BF16 or AMX paths; the same benchmark differs by ~3x across them),
and the allocator (tcmalloc or glibc malloc, from LD_PRELOAD)."""

from __future__ import annotations

import os
import platform
from pathlib import Path

VECTOR_FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")


def cpu_model_and_flags(cpuinfo: str) -> tuple[str, list[str]]:
    """(model name, the VECTOR_FLAGS present) from the text of /proc/cpuinfo; ('unknown', []) where absent."""
    model, flags = "unknown", set()
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name" and model == "unknown":
            model = value.strip()
        elif key.strip() == "flags" and not flags:
            flags = set(value.split())
    return model, [flag for flag in VECTOR_FLAGS if flag in flags]


def machine_info() -> dict:
    cpuinfo = Path("/proc/cpuinfo")
    model, flags = cpu_model_and_flags(cpuinfo.read_text() if cpuinfo.is_file() else "")
    return {
        "platform": platform.platform(),
        "cpus": os.cpu_count(),
        "cpu_model": model if model != "unknown" else (platform.processor() or platform.machine()),
        "vector_isa": flags,
        "allocator": "tcmalloc" if "tcmalloc" in os.environ.get("LD_PRELOAD", "") else "glibc malloc",
    }
