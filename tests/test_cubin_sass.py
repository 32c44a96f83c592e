"""tools/cubin_sass.py on synthetic inputs (CPU only)."""

from __future__ import annotations

import os
import struct
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))

import cubin_sass  # noqa: E402


def _elf(machine: int, payload: bytes) -> bytes:
    """A minimal 64-bit ELF: header, `payload` as one PROGBITS section, then the section headers."""
    shoff = 64 + len(payload)
    header = bytearray(64)
    header[0:4] = b"\x7fELF"
    header[4], header[5] = 2, 1
    struct.pack_into("<H", header, 18, machine)
    struct.pack_into("<QQ", header, 0x20, 0, shoff)  # no program headers
    struct.pack_into("<HHHH", header, 0x36, 0, 0, 64, 2)
    null = bytes(64)
    sec = bytearray(64)
    struct.pack_into("<I", sec, 4, 1)  # SHT_PROGBITS
    struct.pack_into("<QQ", sec, 0x18, 64, len(payload))
    return bytes(header) + payload + null + bytes(sec)


def test_cubins_cuts_out_cuda_elves_only():
    cuda = _elf(cubin_sass.EM_CUDA, b"sass" * 10)
    host = _elf(62, b"x86" * 5)  # EM_X86_64: not device code
    blob = b"junk" + host + b"\x00" * 7 + cuda + b"tail\x7fELF"
    found = cubin_sass.cubins(blob)
    assert found == [cuda]


def test_counts_per_kernel_by_section():
    listing = "\n".join([
        "\t.section\t.text._Z3fooPf,\"ax\",@progbits",
        "        /*0000*/  QGMMA.64x128x32 R24, gdesc[UR4], RZ ;",
        "        /*0010*/  FFMA R1, R2, R3, R4 ;",
        "        /*0020*/  QGMMA.64x128x32 R24, gdesc[UR4], R24 ;",
        "\t.section\t.text._Z3barPf,\"ax\",@progbits",
        "        /*0000*/  FFMA R1, R2, R3, R4 ;",
    ])
    got = cubin_sass.counts_per_kernel(listing, "foo", ["QGMMA", "FFMA"])
    assert got == {"_Z3fooPf": {"QGMMA": 2, "FFMA": 1}}
    assert cubin_sass.counts_per_kernel(listing, "bar", ["QGMMA"]) == {"_Z3barPf": {"QGMMA": 0}}
