"""Read an AMDGPU code object: the ELF header and its ``NT_AMDGPU_METADATA`` note.

This is the independent oracle for every kernel we ship. The compiler side uses it
to record each kernel's ABI; the runtime uses it to verify what it loads; the test
doubles use it to check every launch. It depends on nothing but the standard
library and ``msgpack``, so the runtime can import it.

Only what we need is parsed: ELF64 little-endian, the machine and flags, and the
note that the AMDGPU backend emits for code object v4+ (msgpack, see the LLVM
AMDGPUUsage document, "Code Object V3+ Metadata").
"""

from __future__ import annotations

import struct
from operator import add as _add
from typing import NamedTuple

import msgpack

EM_AMDGPU = 224
ELFOSABI_AMDGPU_HSA = 64
#: EI_ABIVERSION -> code object version.
ABI_VERSION_TO_COV = {2: 4, 3: 5, 4: 6}
EF_AMDGPU_MACH = 0x0FF
EF_AMDGPU_FEATURE_XNACK_V4 = 0x300
EF_AMDGPU_FEATURE_SRAMECC_V4 = 0xC00
EF_AMDGPU_GENERIC_VERSION = 0xFF000000
#: The machines we name. Values from LLVM's ELF.h.
MACH_NAMES = {0x04C: "gfx942", 0x04F: "gfx950", 0x030: "gfx90a", 0x040: "gfx940"}
NT_AMDGPU_METADATA = 32
SHT_NOTE = 7
SHT_SYMTAB = 2
SHT_DYNSYM = 11


class CodeObjectError(ValueError):
    """The bytes are not a well-formed AMDGPU code object."""


class KernelArg(NamedTuple):
    """One explicit or hidden kernel argument, as the metadata note describes it."""

    offset: int
    size: int
    value_kind: str  # "global_buffer", "by_value", "hidden_*", ...
    name: str = ""
    address_space: str = ""

    def to_json(self) -> dict:
        return {
            "offset": self.offset,
            "size": self.size,
            "value_kind": self.value_kind,
            "name": self.name,
            "address_space": self.address_space,
        }


class KernelMetadata(NamedTuple):
    """One entry of ``amdhsa.kernels``."""

    name: str
    symbol: str
    kernarg_size: int
    kernarg_align: int
    args: tuple[KernelArg, ...]
    vgpr_count: int
    sgpr_count: int
    agpr_count: int
    vgpr_spill_count: int
    sgpr_spill_count: int
    lds_bytes: int  # .group_segment_fixed_size
    scratch_bytes: int  # .private_segment_fixed_size
    max_flat_workgroup_size: int
    wavefront_size: int
    reqd_workgroup_size: tuple[int, ...] | None = None

    @property
    def spills(self) -> int:
        return self.vgpr_spill_count + self.sgpr_spill_count

    def to_json(self) -> dict:
        return {
            "name": self.name,
            "symbol": self.symbol,
            "kernarg_size": self.kernarg_size,
            "kernarg_align": self.kernarg_align,
            "args": [a.to_json() for a in self.args],
            "vgpr_count": self.vgpr_count,
            "sgpr_count": self.sgpr_count,
            "agpr_count": self.agpr_count,
            "vgpr_spill_count": self.vgpr_spill_count,
            "sgpr_spill_count": self.sgpr_spill_count,
            "lds_bytes": self.lds_bytes,
            "scratch_bytes": self.scratch_bytes,
            "max_flat_workgroup_size": self.max_flat_workgroup_size,
            "wavefront_size": self.wavefront_size,
            "reqd_workgroup_size": list(self.reqd_workgroup_size)
            if self.reqd_workgroup_size
            else None,
        }

    @classmethod
    def from_json(cls, d: dict) -> "KernelMetadata":
        return cls(
            name=d["name"],
            symbol=d["symbol"],
            kernarg_size=d["kernarg_size"],
            kernarg_align=d["kernarg_align"],
            args=tuple(KernelArg(**a) for a in d["args"]),
            vgpr_count=d["vgpr_count"],
            sgpr_count=d["sgpr_count"],
            agpr_count=d["agpr_count"],
            vgpr_spill_count=d["vgpr_spill_count"],
            sgpr_spill_count=d["sgpr_spill_count"],
            lds_bytes=d["lds_bytes"],
            scratch_bytes=d["scratch_bytes"],
            max_flat_workgroup_size=d["max_flat_workgroup_size"],
            wavefront_size=d["wavefront_size"],
            reqd_workgroup_size=tuple(d["reqd_workgroup_size"])
            if d.get("reqd_workgroup_size")
            else None,
        )


class CodeObject(NamedTuple):
    """What a loader needs to know about a code object before trusting it.

    The three types here are named tuples (immutable, compared by value): a rank's startup
    parses tens of code objects and makes one of each per kernel argument."""

    mach: int  # EF_AMDGPU_MACH value
    arch: str  # "gfx950", or "mach-0x..." when unknown
    code_object_version: int
    xnack: str  # "any" | "off" | "on" | "unsupported"
    sramecc: str
    target: str  # amdhsa.target, e.g. "amdgcn-amd-amdhsa--gfx950"
    kernels: tuple[KernelMetadata, ...]
    #: Symbols the object references but does not define. A loadable kernel has
    #: none: an unresolved cco device function means the bitcode was not linked.
    undefined_symbols: tuple[str, ...] = ()

    def kernel(self, name: str | None = None) -> KernelMetadata:
        """The named kernel, or the only one."""
        if name is None:
            if len(self.kernels) != 1:
                raise CodeObjectError(
                    f"code object holds {len(self.kernels)} kernels "
                    f"({[k.name for k in self.kernels]}); name the one you want"
                )
            return self.kernels[0]
        for k in self.kernels:
            if k.name == name:
                return k
        raise CodeObjectError(
            f"code object has no kernel {name!r}; it has {[k.name for k in self.kernels]}"
        )


def parse_code_object(data: bytes) -> CodeObject:
    """Parse ``data`` as an AMDGPU ELF. Raises :class:`CodeObjectError` if it is not one."""
    if len(data) < 64 or data[:4] != b"\x7fELF":
        raise CodeObjectError("not an ELF file (bad magic or shorter than an ELF header)")
    if data[4] != 2 or data[5] != 1:
        raise CodeObjectError("not a 64-bit little-endian ELF")
    osabi, abiversion = data[7], data[8]
    e_machine, e_shoff, e_flags, e_shentsize, e_shnum, e_shstrndx = _ELF_HEADER.unpack_from(data, 16)
    if e_machine != EM_AMDGPU:
        raise CodeObjectError(f"ELF machine is {e_machine}, not EM_AMDGPU ({EM_AMDGPU})")
    if osabi != ELFOSABI_AMDGPU_HSA:
        raise CodeObjectError(f"ELF OS/ABI is {osabi}, not AMDGPU_HSA ({ELFOSABI_AMDGPU_HSA})")
    cov = ABI_VERSION_TO_COV.get(abiversion)
    if cov is None:
        raise CodeObjectError(f"unknown AMDGPU HSA ABI version {abiversion}")
    if e_shoff == 0 or e_shentsize != 64 or e_shoff + e_shnum * 64 > len(data):
        raise CodeObjectError("section header table is missing or truncated")

    # The section table in one unpack of the four fields read, by column (sh_type, sh_offset,
    # sh_size, sh_link).
    table = _repeated(_SECTION, e_shnum).unpack_from(data, e_shoff)
    types, offsets, sizes, links = table[0::4], table[1::4], table[2::4], table[3::4]
    n = len(data)
    if e_shnum and max(map(_add, offsets, sizes)) > n:  # one C pass; the slow one names the section
        for i, (sh_type, off, size) in enumerate(zip(types, offsets, sizes)):
            if off + size > n and sh_type != 8:  # 8 = SHT_NOBITS
                raise CodeObjectError(f"section {i} extends past the end of the file (truncated?)")
    if e_shstrndx >= e_shnum:
        raise CodeObjectError("bad section-name string table index")

    meta: tuple[str, tuple[KernelMetadata, ...]] | None = None  # the last metadata note's
    undefined: set[str] = set()
    for i, sh_type in enumerate(types):
        if sh_type not in _READ_TYPES:
            continue
        if sh_type == SHT_NOTE:
            got = _metadata_note(data, offsets[i], offsets[i] + sizes[i])
            if got is not None:
                meta = got
        elif links[i] < e_shnum:
            undefined.update(_undefined_symbols(data, offsets[i], sizes[i], offsets[links[i]],
                                                offsets[links[i]] + sizes[links[i]]))
    if meta is None:
        raise CodeObjectError("no NT_AMDGPU_METADATA note (not a code object v3+?)")
    target, kernels = meta
    mach = e_flags & EF_AMDGPU_MACH
    arch = MACH_NAMES.get(mach)
    # positional, in field order: a named tuple made by keyword costs twice as much
    return CodeObject(mach, arch if arch is not None else f"mach-0x{mach:x}", cov,
                      _XNACK.get(e_flags & EF_AMDGPU_FEATURE_XNACK_V4),
                      _SRAMECC.get(e_flags & EF_AMDGPU_FEATURE_SRAMECC_V4), target, kernels,
                      tuple(sorted(undefined)))


#: The sections read: the symbol tables (undefined symbols) and the notes (the metadata).
_READ_TYPES = frozenset({SHT_SYMTAB, SHT_DYNSYM, SHT_NOTE})
#: Elf64_Ehdr from e_type: the machine, the section table's offset, the flags, and the section
#: table's entry size, count and string-table index (the rest skipped).
_ELF_HEADER = struct.Struct("<2xH20xQI6xHHH")
#: Elf64_Shdr: type, offset, size, link (name, flags, addr, info, addralign, entsize skipped).
_SECTION = "4xI16xQQI20x"
#: Elf64_Sym: name, shndx (info, other, value, size skipped).
_SYMBOL = "I2xH16x"
_NOTE_HEADER = struct.Struct("<III")  # Elf64_Nhdr: namesz, descsz, type
_XNACK = {0x000: "unsupported", 0x100: "any", 0x200: "off", 0x300: "on"}
_SRAMECC = {0x000: "unsupported", 0x400: "any", 0x800: "off", 0xC00: "on"}
_STRUCTS: dict[tuple[str, int], struct.Struct] = {}


def _repeated(fmt: str, count: int) -> struct.Struct:
    """A little-endian Struct of ``count`` consecutive ``fmt`` records (cached: tables repeat sizes)."""
    st = _STRUCTS.get((fmt, count))
    if st is None:
        if len(_STRUCTS) >= 256:
            _STRUCTS.clear()
        st = _STRUCTS[(fmt, count)] = struct.Struct("<" + fmt * count)
    return st


def _undefined_symbols(data: bytes, off: int, size: int, str_off: int, str_end: int) -> list[str]:
    """The names of a symbol table's undefined symbols (st_shndx 0, SHN_UNDEF, with a name).
    Entry 0 is the null symbol; a trailing partial entry is ignored."""
    count = (size - 24) // 24 if size >= 24 else 0
    if count == 0:
        return []
    syms = _repeated(_SYMBOL, count).unpack_from(data, off + 24)
    shndx = syms[1::2]
    if 0 not in shndx:  # a linked code object: every symbol is defined
        return []
    out = []
    for st_name, st_shndx in zip(syms[0::2], shndx):
        if st_shndx == 0 and st_name:
            end = data.find(b"\0", str_off + st_name, str_end)
            out.append(data[str_off + st_name: end].decode("ascii", "replace"))
    return out


def _metadata_note(data: bytes, pos: int, end: int) -> tuple[str, tuple[KernelMetadata, ...]] | None:
    """The last NT_AMDGPU_METADATA note of the note section ``data[pos:end]``, parsed, or None."""
    meta = None
    while pos + 12 <= end:
        namesz, descsz, ntype = _NOTE_HEADER.unpack_from(data, pos)
        pos += 12
        nname = data[pos: pos + namesz].rstrip(b"\0")
        pos += (namesz + 3) & ~3
        desc = data[pos: pos + descsz]
        pos += (descsz + 3) & ~3
        if pos > end:
            raise CodeObjectError("note section is truncated")
        if nname == b"AMDGPU" and ntype == NT_AMDGPU_METADATA:
            meta = _note(desc)
    return meta


#: Parsed metadata notes by their bytes. A rank's code objects repeat a few notes (the reference
#: manifest's rank 0: 10 distinct in 53 -- a GEMM's is the same for every M), and what a note
#: parses to depends on its bytes alone; the values are immutable. Bounded: cleared when full.
_NOTES: dict[bytes, tuple[str, tuple[KernelMetadata, ...]]] = {}
_NOTES_MAX = 4096


def _note(desc: bytes) -> tuple[str, tuple[KernelMetadata, ...]]:
    """(``amdhsa.target``, the kernels) of an NT_AMDGPU_METADATA note's msgpack ``desc``."""
    got = _NOTES.get(desc)
    if got is None:
        try:
            meta = msgpack.unpackb(desc, raw=False, strict_map_key=False)
        except Exception as exc:  # msgpack raises several types
            raise CodeObjectError(f"NT_AMDGPU_METADATA is not valid msgpack: {exc}") from exc
        if not isinstance(meta, dict):
            raise CodeObjectError(f"NT_AMDGPU_METADATA is a msgpack {type(meta).__name__}, not a map")
        got = (str(meta.get("amdhsa.target", "")), tuple(_kernel_meta(k) for k in meta.get("amdhsa.kernels", [])))
        if len(_NOTES) >= _NOTES_MAX:
            _NOTES.clear()
        _NOTES[desc] = got
    return got


def forget_parsed_notes() -> None:
    """Empty the per-process cache of parsed metadata notes (for benchmarks that measure a first parse)."""
    _NOTES.clear()


def _kernel_meta(k: dict) -> KernelMetadata:
    # positional, in field order (KernelArg, KernelMetadata): a named tuple made by keyword costs
    # twice as much, and a rank's first notes make hundreds of arguments
    try:
        args = tuple([
            KernelArg(int(a[".offset"]), int(a[".size"]), str(a[".value_kind"]), str(a.get(".name", "")),
                      str(a.get(".address_space", "")))
            for a in k.get(".args", [])
        ])
        reqd = k.get(".reqd_workgroup_size")
        return KernelMetadata(
            str(k[".name"]),
            str(k[".symbol"]),
            int(k[".kernarg_segment_size"]),
            int(k[".kernarg_segment_align"]),
            args,
            int(k.get(".vgpr_count", 0)),
            int(k.get(".sgpr_count", 0)),
            int(k.get(".agpr_count", 0)),
            int(k.get(".vgpr_spill_count", 0)),
            int(k.get(".sgpr_spill_count", 0)),
            int(k.get(".group_segment_fixed_size", 0)),  # lds_bytes
            int(k.get(".private_segment_fixed_size", 0)),  # scratch_bytes
            int(k.get(".max_flat_workgroup_size", 0)),
            int(k.get(".wavefront_size", 64)),
            tuple(int(x) for x in reqd) if reqd else None,
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise CodeObjectError(f"kernel metadata entry is malformed: {exc!r}") from exc
