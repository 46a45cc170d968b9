"""The benchmarks' machine record names the CPU model and the vector instruction sets that decide kernel speed."""

from __future__ import annotations

from tests.helpers.scripts import load_script


def load_machine_module():
    return load_script("scripts/bench/machine.py")


def test_cpu_model_and_vector_flags_from_cpuinfo():
    machine = load_machine_module()
    cpuinfo = (
        "processor\t: 0\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\n"
        "flags\t\t: fpu sse2 avx avx2 avx512f avx512_bf16 amx_tile amx_bf16 avx512_vnni\n\n"
        "processor\t: 1\nmodel name\t: Intel(R) Xeon(R) Platinum 8480+\nflags\t\t: fpu sse2 avx avx2\n"
    )
    assert machine.cpu_model_and_flags(cpuinfo) == (
        "Intel(R) Xeon(R) Platinum 8480+",
        ["avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile"],
    )
    assert machine.cpu_model_and_flags("model name : AMD EPYC\nflags : avx avx2 fma\n") == ("AMD EPYC", ["avx2"])
    assert machine.cpu_model_and_flags("") == ("unknown", [])


def test_machine_record_has_the_fields_results_files_carry():
    record = load_machine_module().machine_info()
    assert {"platform", "cpus", "cpu_model", "vector_isa", "allocator"} <= set(record)
    assert record["cpu_model"] and record["allocator"] in ("tcmalloc", "glibc malloc")
