"""mori's hipcc-JIT kernels as data: which sources mori compiles at first use, for which archs and
NIC variants, and what a lock says of each code object the build made.

mori (1.2.4 and its nightly) compiles one ``.hip`` source of ``mori/_jit-sources`` into one code
object with ``hipcc --genco`` the first time a family is used (``mori.jit.core.compile_genco``),
keyed by arch and NIC. The build makes those code objects ahead of time
(``gemmar_aot_kernels.hipcc``); a pod hands them to mori where it asks for them
(``gemmar_aot.runtime.hipcc_server``). Both sides read the tables here; neither imports mori for them.

Standard library only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # nothing of ours at run time: a hipcc compile imports this module
    from gemmar_aot.model.types import Digest

#: mori's hipcc-JIT sources, by the name its Python compiles them under, and their directory in
#: ``_jit-sources`` (``compile_genco``'s ``source_dir``): ``mori.jit.precompile``'s lists, the
#: EP v1 op (``dispatch_combine._KERNEL_TYPE_TO_HIP``), ``local_expert_count``, the collectives
#: (``ccl/collective.py``), shmem (``shmem/api.py``) and IO (``io/*_jit.py``).
SOURCES = {
    "ep_intranode": "src/ops/kernels", "ep_internode": "src/ops/kernels", "ep_internode_v1": "src/ops/kernels",
    "ep_internode_v1ll": "src/ops/kernels", "ep_async_ll": "src/ops/kernels",
    "ep_local_expert_count": "src/ops/kernels", "cast_kernel": "src/ops/kernels", "shmem_kernels": "src/ops/kernels",
    "ccl_kernels": "src/collective/kernels", "scatter_gather": "src/io/kernels", "fabric_copy": "src/io/kernels",
}
#: Where the toolchain's setup unpacks the HIP SDK (``gemmar_aot.toolchain.rocm_sdk``), relative to its
#: root, and where a compile finds it (``gemmar_aot_kernels.hipcc``).
SDK_REL = "rocm-sdk"
#: The archs built (mori's _SUPPORTED_ARCHS less gfx1250, whose TDM header no package we reach carries).
ARCHS = ("gfx942", "gfx950")
#: What each arch is, for messages.
ARCH_GPUS = {"gfx942": "MI300X/MI325X", "gfx950": "MI355X/MI350X"}
#: mori's NIC variants (``jit/config.py`` detect_nic_type, ``jit/core.py`` _nic_defines and its
#: ionic CCQE probe): variant -> (what MORI_DEVICE_NIC names, CCQE).
NICS = {"mlx5": ("mlx5", False), "bnxt": ("bnxt", False), "ionic": ("ionic", False), "ionic-ccqe": ("ionic", True)}


def nic_variant(nic: str, ccqe: bool) -> str:
    """The variant of mori's detected NIC and its CCQE answer (CCQE only means something on ionic)."""
    return "ionic-ccqe" if nic == "ionic" and ccqe else nic


@dataclass(frozen=True, order=True)
class HipccVariant:
    """One code object mori compiles: a source for an arch and NIC variant, with or without the host proxy."""

    source: str
    arch: str
    nic: str
    host_proxy: bool = False

    @property
    def dir(self) -> str:
        return SOURCES[self.source]

    def describe(self) -> str:
        return f"{self.source} for {self.arch}, NIC {self.nic}" + (" with the host proxy" if self.host_proxy else "")

    def to_json(self) -> dict:
        return {"source": self.source, "arch": self.arch, "nic": self.nic, "host_proxy": self.host_proxy}


@dataclass(frozen=True)
class CodeObjectEntry:
    """A kernel the lock names that is loaded whole rather than launched by us (mori launches it):
    its action key, its code object and the record it was made from, as for a launch entry."""

    kind: str  # its spec's kind: mori's source name
    key: str
    blob: "Digest"
    record: "Digest"
    symbols: tuple[str, ...]  # the kernels the code object defines (its metadata note)


@dataclass(frozen=True)
class LockHipcc:
    """One built hipcc code object: which variant, where the manifest asked for it, its kernel."""

    variant: HipccVariant
    source: str  # "manifest.toml:hipcc[0] (line 3)"
    entry: CodeObjectEntry

    def to_json(self) -> dict:
        e = self.entry
        return {**self.variant.to_json(), "origin": self.source, "key": e.key, "blob": e.blob.to_json(),
                "record": e.record.to_json(), "symbols": list(e.symbols)}


#: The members of a lock's ``hipcc`` item.
LOCK_KEYS = ("source", "arch", "nic", "host_proxy", "origin", "key", "blob", "record", "symbols")


def read_lock_hipcc(reader: Any, v: Any, path: str) -> LockHipcc:
    """One ``hipcc`` item of a lock, checked with the lock reader's own checks (``reader``)."""
    reader.obj(v, path, LOCK_KEYS)
    src, arch, nic = (reader.str(v[k], f"{path}.{k}") for k in ("source", "arch", "nic"))
    for k, got, allowed in (("source", src, SOURCES), ("arch", arch, ARCHS), ("nic", nic, NICS)):
        if got not in allowed:
            raise reader.fail(f"{path}.{k}", f"is {got!r}, none of {sorted(allowed)}")
    if type(v["host_proxy"]) is not bool:
        raise reader.fail(f"{path}.host_proxy", "expected true or false")
    syms = reader.list(v["symbols"], f"{path}.symbols")
    for i, s in enumerate(syms):
        reader.str(s, f"{path}.symbols[{i}]")
    entry = CodeObjectEntry(src, reader.hex64(v["key"], f"{path}.key"), reader.digest(v["blob"], f"{path}.blob"),
                            reader.digest(v["record"], f"{path}.record"), tuple(syms))
    return LockHipcc(HipccVariant(src, arch, nic, v["host_proxy"]), reader.str(v["origin"], f"{path}.origin",
                                                                                 empty=True), entry)
