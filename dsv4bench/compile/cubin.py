"""Read resource usage out of a cubin (an ELF file) without a GPU or the CUDA toolkit.

ptxas records per-kernel attributes in `.nv.info` sections: EIATTR_REGCOUNT (registers per
thread), EIATTR_FRAME_SIZE (local memory per thread: > 0 means spills or stack arrays) and
EIATTR_MAX_STACK_SIZE. Static shared memory is the size of the `.nv.shared.<kernel>` section.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

_EIFMT_HVAL, _EIFMT_SVAL = 3, 4
_EIATTR_FRAME_SIZE, _EIATTR_MAX_STACK_SIZE, _EIATTR_REGCOUNT = 0x11, 0x23, 0x2F


@dataclass(frozen=True)
class CubinInfo:
    cubin_bytes: int
    registers: int | None
    local_bytes: int | None  # per-thread local memory (spills + stack); 0 = no spills
    static_smem_bytes: int
    sm: int | None  # e.g. 90, 100, from the ELF flags


def _sections(blob: bytes):
    shoff = struct.unpack_from("<Q", blob, 0x28)[0]
    shentsize, shnum, shstrndx = struct.unpack_from("<HHH", blob, 0x3A)
    raw = [struct.unpack_from("<IIQQQQIIQQ", blob, shoff + i * shentsize) for i in range(shnum)]
    names_off = raw[shstrndx][4]
    for name, _typ, _flags, _addr, off, size, *_ in raw:
        end = blob.index(b"\0", names_off + name)
        yield blob[names_off + name : end].decode(), blob[off : off + size]


def _attributes(data: bytes):
    i = 0
    while i + 4 <= len(data):
        fmt, attr = data[i], data[i + 1]
        if fmt == _EIFMT_SVAL:
            size = struct.unpack_from("<H", data, i + 2)[0]
            yield attr, data[i + 4 : i + 4 + size]
            i += 4 + size
        elif fmt == _EIFMT_HVAL:
            yield attr, data[i + 2 : i + 4]
            i += 4
        else:
            i += 2


def parse_cubin(blob: bytes) -> CubinInfo:
    regs = local = None
    smem = 0
    for name, data in _sections(blob):
        if name == ".nv.info":  # global section: (symbol, value) pairs per kernel
            for attr, payload in _attributes(data):
                if len(payload) < 8:
                    continue
                value = struct.unpack_from("<I", payload, 4)[0]
                if attr == _EIATTR_REGCOUNT:
                    regs = max(regs or 0, value)
                elif attr in (_EIATTR_FRAME_SIZE, _EIATTR_MAX_STACK_SIZE):
                    local = max(local or 0, value)
        elif name.startswith(".nv.shared.") and not name.startswith(".nv.shared.reserved"):
            smem += len(data)
    # e_flags carry the SM: bits 0-7 in the ELF ABI v7 cubins (sm_90a: 0x5a0d5a), bits 8-15
    # from ABI v8 on (sm_100a: 0x0600640a)
    flags, abi_version = struct.unpack_from("<I", blob, 0x30)[0], blob[8]
    sm = (flags >> 8) & 0xFF if abi_version >= 8 else flags & 0xFF
    return CubinInfo(len(blob), regs, local if local is not None else 0, smem, sm or None)
