"""Zero, in a shared library's CUDA fat binary, the kernels a GPU of one architecture never loads, so the library
compresses to a fraction of its size (the GPU bundle must fit the device tool's 64 MiB carry: scripts/
gpu_vllm_bundle.sh). The file keeps its size and layout; only payload bytes become zeros.

    python scripts/fatbin_keep_arch.py LIB.so --sm 90        (in place; prints what it kept and zeroed)

The `.nv_fatbin` section holds containers (a 16-byte header: magic 0xBA55ED50, u16 version, u16 header size, u64
size of the entries after it), each a chain of entries (u16 kind: 1 PTX, 2 ELF cubin; u16 version; u32 header size;
u64 padded payload size; the target's SM number as a u32 at byte 28), the payload right after the entry's header
(the layout ZLUDA's and gpgpu-sim's fat-binary readers use). Kept: the cubins of `--sm`'s major version up to `--sm` (a
cubin runs on its own major version at an equal or higher minor), every PTX for an SM ≤ `--sm` (the driver compiles
PTX for a kernel that has no cubin for the device) and any entry of another kind. Every entry is checked to lie within
its container and the chain to end exactly at the container's size before anything is written; a file whose section
does not parse is left as it was, with an error.
"""

from __future__ import annotations

import argparse
import struct
import subprocess
import sys
from collections import Counter
from pathlib import Path

MAGIC = 0xBA55ED50
PTX, CUBIN = 1, 2


def fatbin_section(path: Path) -> tuple[int, int]:
    """(file offset, size) of the `.nv_fatbin` section (readelf)."""
    table = subprocess.run(["readelf", "-S", "--wide", str(path)], capture_output=True, text=True, check=True).stdout
    for line in table.splitlines():
        fields = line.split("]", 1)[1].split() if "]" in line else []  # name, type, address, offset, size, ...
        if fields and fields[0] == ".nv_fatbin":
            return int(fields[3], 16), int(fields[4], 16)
    raise ValueError(f"{path} has no .nv_fatbin section")


def entries(data: bytearray, start: int, end: int):
    """(offset of payload, padded payload size, kind, sm) of every entry of every container in data[start:end]."""
    pos = start
    while pos < end:
        if struct.unpack_from("<I", data, pos)[0] != MAGIC:
            if data[pos] != 0:  # containers are separated by zero padding only
                raise ValueError(f"no fat-binary container at {pos:#x}")
            pos += 1
            continue
        _, _, header, size = struct.unpack_from("<IHHQ", data, pos)
        entry, stop = pos + header, pos + header + size
        if stop > end:
            raise ValueError(f"the container at {pos:#x} runs past the section")
        while entry < stop:
            kind, _, entry_header, padded = struct.unpack_from("<HHIQ", data, entry)
            if entry_header < 32 or entry + entry_header + padded > stop:
                raise ValueError(f"the entry at {entry:#x} does not fit its container")
            sm = struct.unpack_from("<I", data, entry + 28)[0]
            yield entry + entry_header, padded, kind, sm
            entry += entry_header + padded
        if entry != stop:
            raise ValueError(f"the container at {pos:#x} does not end where its header says")
        pos = stop


def keep_arch(path: Path, sm: int) -> Counter:
    """Zero the payloads `sm` does not load; bytes kept and zeroed by (kind, sm)."""
    data = bytearray(path.read_bytes())
    start, size = fatbin_section(path)
    try:
        found = list(entries(data, start, start + size))  # parses all before any byte changes
    except struct.error as err:
        raise ValueError(f"the fat binary is truncated ({err})") from err
    report: Counter = Counter()
    for payload, padded, kind, target in found:
        kept = kind not in (PTX, CUBIN) or target <= sm and (kind == PTX or target // 10 == sm // 10)
        name = {PTX: "ptx", CUBIN: "cubin"}.get(kind, f"kind {kind}")
        report[("kept" if kept else "zeroed", name, target)] += padded
        if not kept:
            data[payload : payload + padded] = bytes(padded)
    path.write_bytes(data)
    return report


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("library", type=Path)
    parser.add_argument("--sm", type=int, required=True, help="the GPU's SM number (90: H100, H200)")
    args = parser.parse_args()
    try:
        report = keep_arch(args.library, args.sm)
    except ValueError as err:
        sys.exit(f"{args.library}: {err} (left unchanged)")
    for (what, kind, target), size in sorted(report.items()):
        print(f"{what:6} {kind:5} sm_{target}: {size / 2**20:6.1f} MiB")


if __name__ == "__main__":
    main()
