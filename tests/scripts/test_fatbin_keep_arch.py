"""scripts/fatbin_keep_arch.py on a real ELF file carrying a fat binary built here: a copy of a small shared library
with a `.nv_fatbin` section (objcopy) of two containers — cubins and PTX for several SM numbers, zero padding between
the containers — zeroes exactly the payloads an sm_90 GPU never loads and keeps every other byte."""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "scripts"))

from fatbin_keep_arch import CUBIN, MAGIC, PTX, fatbin_section, keep_arch  # noqa: E402


def entry(kind: int, sm: int, payload: bytes) -> bytes:
    """One fat-binary entry: a 64-byte header (kind, version, header size, padded payload size, SM at byte 28)."""
    header = bytearray(64)
    struct.pack_into("<HHIQ", header, 0, kind, 0x0101, 64, len(payload))
    struct.pack_into("<I", header, 28, sm)
    return bytes(header) + payload


def container(*entries: bytes) -> bytes:
    body = b"".join(entries)
    return struct.pack("<IHHQ", MAGIC, 1, 16, len(body)) + body


@pytest.fixture
def library(tmp_path):
    """(an ELF with the fat binary, {(kind, sm): payload})."""
    if not (shutil.which("objcopy") and shutil.which("readelf")):
        pytest.skip("binutils (objcopy, readelf) are not installed")
    payloads = {
        (CUBIN, 80): b"\x11" * 96,
        (CUBIN, 90): b"\x22" * 64,
        (PTX, 80): b"\x33" * 32,
        (PTX, 100): b"\x44" * 48,
        (CUBIN, 120): b"\x55" * 80,
        (PTX, 90): b"\x66" * 16,
        (CUBIN, 86): b"\x77" * 24,
    }
    items = [entry(kind, sm, payload) for (kind, sm), payload in payloads.items()]
    blob = container(*items[:3]) + bytes(8) + container(*items[3:])  # zero padding between the containers
    (tmp_path / "fatbin").write_bytes(blob)
    elf = tmp_path / "lib.so"
    shutil.copy(sys.executable, elf)  # any ELF file does
    subprocess.run(
        ["objcopy", "--add-section", f".nv_fatbin={tmp_path / 'fatbin'}", str(elf)], check=True, capture_output=True
    )
    return elf, payloads


@pytest.mark.parametrize(
    "sm, kept",
    [
        (90, {(CUBIN, 90), (PTX, 80), (PTX, 90)}),
        (86, {(CUBIN, 80), (CUBIN, 86), (PTX, 80)}),  # a cubin runs on its major version at an equal or higher minor
    ],
)
def test_only_what_the_gpu_can_load_is_kept(library, sm, kept):
    elf, payloads = library
    before = elf.read_bytes()
    start, size = fatbin_section(elf)
    report = keep_arch(elf, sm)
    after = elf.read_bytes()
    assert len(after) == len(before)
    section = after[start : start + size]
    for key, payload in payloads.items():
        assert (section.find(payload) >= 0) is (key in kept), key
    changed = [i for i, (a, b) in enumerate(zip(before, after, strict=True)) if a != b]
    zeroed = sum(len(payload) for key, payload in payloads.items() if key not in kept)
    assert all(start <= i < start + size for i in changed) and len(changed) == zeroed  # the zeroed payloads only
    assert report[("zeroed", "cubin", 120)] == 80 and report[("kept", "ptx", 80)] == 32


@pytest.mark.parametrize(
    "offset, fmt, value",
    [
        (8, "<Q", 1000),  # the first container claims more bytes than its entries hold
        (16 + 4, "<I", 0),  # an entry with an empty header (would never advance)
        (16 + 8, "<Q", 10**6),  # an entry whose payload runs past its container
    ],
)
def test_a_broken_chain_leaves_the_file_as_it_was(library, offset, fmt, value):
    elf, _ = library
    start, _ = fatbin_section(elf)
    data = bytearray(elf.read_bytes())
    struct.pack_into(fmt, data, start + offset, value)
    elf.write_bytes(data)
    with pytest.raises(ValueError):
        keep_arch(elf, 90)
    assert elf.read_bytes() == bytes(data)
