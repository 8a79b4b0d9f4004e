"""A code object's own metadata note, read for the test doubles without gemmar_aot.

The doubles' expectations must not come from the code under test, so this does not
use :mod:`gemmar_aot.model.codeobject` (which the compiler and the runtime share). It
takes a different path to the same bytes: the runtime loader's, through the ELF
*program* headers (the ``PT_NOTE`` segment), where ``gemmar_aot.model.codeobject`` walks
the section headers; and it reads the symbol table through ``PT_DYNAMIC``
(``DT_SYMTAB``, ``DT_STRTAB``, ``DT_HASH``), which is what a loader resolves
``hipModuleGetFunction`` against. ``msgpack`` decodes the note (a third-party
decoder, not ours). Keys are the LLVM AMDGPUUsage names ("Code Object V3+ Metadata").

What it returns is what the code object itself says about each kernel: the kernarg
segment's size and alignment, each argument's offset, size and kind, the required or
maximum workgroup size and the static LDS. Nothing here knows about launch records.
"""

from __future__ import annotations

import struct
from dataclasses import dataclass

import msgpack

PT_LOAD, PT_DYNAMIC, PT_NOTE = 1, 2, 4
DT_NULL, DT_HASH, DT_STRTAB, DT_SYMTAB = 0, 4, 5, 6
NT_AMDGPU_METADATA = 32
EM_AMDGPU = 224


class NoteError(ValueError):
    """The bytes are not a code object this reader can vouch for."""


@dataclass(frozen=True)
class NoteArg:
    offset: int
    size: int
    kind: str  # .value_kind: "global_buffer", "by_value", "hidden_*"

    @property
    def hidden(self) -> bool:
        return self.kind.startswith("hidden_")


@dataclass(frozen=True)
class NoteKernel:
    name: str
    symbol: str  # the kernel descriptor, "<name>.kd"
    kernarg_size: int
    kernarg_align: int
    args: tuple[NoteArg, ...]
    max_flat_workgroup_size: int
    reqd_workgroup_size: tuple[int, ...] | None
    lds_bytes: int

    @property
    def explicit_args(self) -> tuple[NoteArg, ...]:
        return tuple(a for a in self.args if not a.hidden)


@dataclass(frozen=True)
class NoteCodeObject:
    target: str  # amdhsa.target, e.g. "amdgcn-amd-amdhsa--gfx950"
    kernels: dict  # name -> NoteKernel
    dynamic_symbols: frozenset  # names in the dynamic symbol table

    def kernel(self, name: str) -> NoteKernel:
        k = self.kernels.get(name)
        if k is None:
            raise KeyError(f"no kernel {name!r} in the code object's note (it has {sorted(self.kernels)})")
        if k.symbol not in self.dynamic_symbols:
            raise KeyError(f"kernel {name!r}: its descriptor {k.symbol!r} is not a dynamic symbol")
        return k


def read_note(data: bytes) -> NoteCodeObject:
    data = bytes(data)
    if len(data) < 64 or data[:4] != b"\x7fELF" or data[4] != 2 or data[5] != 1:
        raise NoteError("not a 64-bit little-endian ELF")
    e_machine, = struct.unpack_from("<H", data, 18)
    if e_machine != EM_AMDGPU:
        raise NoteError(f"e_machine {e_machine} is not EM_AMDGPU")
    e_phoff, = struct.unpack_from("<Q", data, 32)
    e_phentsize, e_phnum = struct.unpack_from("<HH", data, 54)
    if e_phoff == 0 or e_phnum == 0 or e_phentsize != 56 or e_phoff + e_phnum * 56 > len(data):
        raise NoteError("no program headers (a loadable code object has them)")
    notes, dynamic, loads = [], None, []
    for i in range(e_phnum):
        p_type, _flags, p_offset, p_vaddr, _paddr, p_filesz, _memsz, _align = struct.unpack_from(
            "<IIQQQQQQ", data, e_phoff + i * 56)
        if p_offset + p_filesz > len(data):
            raise NoteError(f"program header {i} extends past the end of the file")
        if p_type == PT_LOAD:
            loads.append((p_vaddr, p_offset, p_filesz))
        elif p_type == PT_NOTE:
            notes.append((p_offset, p_filesz))
        elif p_type == PT_DYNAMIC:
            dynamic = (p_offset, p_filesz)
    meta = None
    for off, size in notes:
        pos, end = off, off + size
        while pos + 12 <= end:
            namesz, descsz, ntype = struct.unpack_from("<III", data, pos)
            name = data[pos + 12:pos + 12 + namesz].rstrip(b"\0")
            desc_at = pos + 12 + ((namesz + 3) & ~3)
            pos = desc_at + ((descsz + 3) & ~3)
            if pos > end:
                raise NoteError("a note runs past its segment")
            if name == b"AMDGPU" and ntype == NT_AMDGPU_METADATA:
                meta = msgpack.unpackb(data[desc_at:desc_at + descsz], raw=False, strict_map_key=False)
    if meta is None:
        raise NoteError("no NT_AMDGPU_METADATA note in a PT_NOTE segment")
    kernels = {}
    for k in meta.get("amdhsa.kernels", []):
        reqd = k.get(".reqd_workgroup_size")
        kern = NoteKernel(
            name=k[".name"], symbol=k[".symbol"], kernarg_size=int(k[".kernarg_segment_size"]),
            kernarg_align=int(k[".kernarg_segment_align"]),
            args=tuple(NoteArg(int(a[".offset"]), int(a[".size"]), str(a[".value_kind"])) for a in k.get(".args", [])),
            max_flat_workgroup_size=int(k[".max_flat_workgroup_size"]),
            reqd_workgroup_size=tuple(int(x) for x in reqd) if reqd else None,
            lds_bytes=int(k.get(".group_segment_fixed_size", 0)))
        kernels[kern.name] = kern
    return NoteCodeObject(str(meta.get("amdhsa.target", "")), kernels, _dynamic_symbols(data, dynamic, loads))


def _dynamic_symbols(data: bytes, dynamic, loads) -> frozenset:
    """Names in the dynamic symbol table, found the loader's way (PT_DYNAMIC -> DT_SYMTAB/DT_STRTAB/DT_HASH)."""
    if dynamic is None:
        raise NoteError("no PT_DYNAMIC segment: nothing a loader could resolve a kernel against")
    tags = {}
    off, size = dynamic
    for pos in range(off, off + size - 15, 16):
        tag, val = struct.unpack_from("<qQ", data, pos)
        if tag == DT_NULL:
            break
        tags[tag] = val
    if not {DT_SYMTAB, DT_STRTAB, DT_HASH} <= tags.keys():
        raise NoteError("the dynamic section lacks DT_SYMTAB, DT_STRTAB or DT_HASH")

    def file_offset(vaddr: int) -> int:  # the dynamic tags hold addresses: map them through PT_LOAD
        for p_vaddr, p_offset, p_filesz in loads:
            if p_vaddr <= vaddr < p_vaddr + p_filesz:
                return p_offset + (vaddr - p_vaddr)
        raise NoteError(f"address {vaddr:#x} is in no PT_LOAD segment")

    symtab, strtab, hash_at = (file_offset(tags[t]) for t in (DT_SYMTAB, DT_STRTAB, DT_HASH))
    _nbucket, nchain = struct.unpack_from("<II", data, hash_at)  # nchain == number of symbols
    names = set()
    for i in range(1, nchain):
        st_name, = struct.unpack_from("<I", data, symtab + 24 * i)
        end = data.index(b"\0", strtab + st_name)
        names.add(data[strtab + st_name:end].decode("ascii", "replace"))
    return frozenset(names)
