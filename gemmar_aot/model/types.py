"""The domain types of a lock, from the leaves up: :class:`Digest`, :class:`TupleKey` and
:class:`TupleId`, :class:`LaunchEntry`, :class:`RankLaunches`, :class:`LockTuple`, and the head's
:class:`ManifestRef` and :class:`ToolchainInfo`; the modes (``TRANSPORTS``). Standard library only."""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Mapping, NamedTuple, Sequence

from gemmar_aot.util.filedigest import is_hex64, sha256_hex
from gemmar_aot.model.launch import LaunchRecord
from gemmar_aot.model.layout import WindowLayout

if TYPE_CHECKING:  # only a lock with [[ep]] entries needs it (its reader imports it then)
    from gemmar_aot.model.ep import Arena, EpConfig

#: The modes (``transport``) a tuple can be built for, by the names mori's benchmark and the PR use.
#:   fused-sdma  GemmAllReduceOp: GEMM with the scatter fused into its epilogue
#:               (SDMA puts), then drain -> reduce -> (fp8 inserts) -> gather.
#:   split-sdma  GEMM(fuse=False), then the SDMA all-reduce: scatter -> reduce ->
#:               (fp8 inserts) -> gather.
#:   split-lsa   GEMM(fuse=False), then the LSA all-reduce (one kernel).
#:   fused-lsa   GEMM(fuse=True, transport="lsa"): the epilogue stores straight into
#:               the peers' windows; then drain (a barrier) -> reduce -> gather.
#:   gemm-only   Mxfp8GemmOp's GEMM, no collective.
#:   gemv        Mxfp8GemvOp: the skinny mxfp8 matmul for M <= 32, one kernel per
#:               M bucket, no collective.
#: The manifest's modes (``workload.MODES``) are these.
TRANSPORTS = ("fused-sdma", "split-sdma", "split-lsa", "fused-lsa", "gemm-only", "gemv")
#: Modes with an all-reduce: a communicator, a window, one kernel set per rank.
COLLECTIVE_MODES = ("fused-sdma", "split-sdma", "split-lsa", "fused-lsa")
#: The mode the runtime's GemmAllReduceOp serves.
FUSED_SDMA = "fused-sdma"
#: The modes without a window: Mxfp8GemmOp's GEMM alone, and Mxfp8GemvOp's skinny kernel.
GEMM_ONLY = "gemm-only"
GEMV = "gemv"


# ---------------------------------------------------------------------------
# Digest
# ---------------------------------------------------------------------------


_DIGEST_MEMBERS = {"hash", "size"}


@dataclass(frozen=True, order=True)
class Digest:
    """Bytes named by their sha256 and their length (Bazel's ``Digest``)."""

    hash: str  # 64 lowercase hex digits
    size: int  # bytes

    def __post_init__(self) -> None:
        if not is_hex64(self.hash):
            raise ValueError(f"a digest's hash must be 64 lowercase hex digits (a sha256), got {self.hash!r}")
        if type(self.size) is not int or self.size < 0:
            raise ValueError(f"a digest's size must be a non-negative integer, got {self.size!r}")

    @classmethod
    def of(cls, data: bytes) -> "Digest":
        return cls(sha256_hex(data), len(data))

    def to_json(self) -> dict:
        """How a Digest is written wherever one is written -- a lock, a record, a closure --
        ``{"hash": 64 hex, "size": n}``: one spelling on disk (:meth:`from_json` reads it)."""
        return {"hash": self.hash, "size": self.size}

    @classmethod
    def from_json(cls, obj: Any) -> "Digest":
        """The Digest :meth:`to_json` wrote; ValueError naming what is wrong when ``obj`` is not one."""
        if type(obj) is not dict or obj.keys() != _DIGEST_MEMBERS:
            raise ValueError(f"not a digest {{\"hash\": 64 hex, \"size\": bytes}}: {obj!r}")
        return cls(obj["hash"], obj["size"])

    def __str__(self) -> str:
        return f"{self.hash}/{self.size}"


# ---------------------------------------------------------------------------
# Tuple identity
# ---------------------------------------------------------------------------


class TupleKey(NamedTuple):
    """What the runtime looks kernels up by, apart from M and rank.

    ``gather_transport`` is None on the bf16 wire, where only an fp8 gather has a
    transport, so a bf16 lookup matches whatever transport the caller passes.
    """

    transport: str
    n: int
    k: int
    world: int
    quant: str
    gather_dtype: str
    gather_transport: str | None
    block_m: int
    sdma_queues: int

    @classmethod
    def make(cls, *, transport: str, n: int, k: int, world: int, quant: str, gather_dtype: str,
             gather_transport: str | None, block_m: int, sdma_queues: int) -> "TupleKey":
        return cls(transport, int(n), int(k), int(world), quant, gather_dtype,
                   None if gather_dtype == "bf16" else gather_transport, int(block_m), int(sdma_queues))

    @property
    def wire(self) -> str:
        return self.gather_dtype + ("" if self.gather_transport is None else f"/{self.gather_transport}")

    def describe(self) -> str:
        return (f"{self.transport} N={self.n} K={self.k} world={self.world} {self.quant} "
                f"block_m={self.block_m} sdma_queues={self.sdma_queues} wire={self.wire}")


@dataclass(frozen=True, order=True)
class TupleId:
    """What makes a manifest tuple one build: two tuples with equal ids are built once."""

    transport: str  # one of TRANSPORTS
    m: int  # padded M
    n: int
    k: int
    world: int
    quant: str
    gather_dtype: str = "bf16"
    gather_transport: str = "lsa"
    block_m: int = 128
    block_n: int = 256
    sdma_queues: int = 1
    m_max: int | None = None  # the window cap the manifest asked for (None: the group's largest M)

    @property
    def collective(self) -> bool:
        """Whether the mode has a window (everything but gemm-only and gemv)."""
        return self.transport in COLLECTIVE_MODES

    @property
    def key(self) -> TupleKey:
        return TupleKey.make(transport=self.transport, n=self.n, k=self.k, world=self.world, quant=self.quant,
                             gather_dtype=self.gather_dtype, gather_transport=self.gather_transport,
                             block_m=self.block_m, sdma_queues=self.sdma_queues)

    def group_key(self) -> tuple:
        """Ids with equal group keys share one window (one op instance): everything but M."""
        return (self.transport, self.n, self.k, self.world, self.quant, self.gather_dtype,
                self.gather_transport, self.block_m, self.block_n, self.sdma_queues, self.m_max)

    def to_json(self) -> dict:
        return {f: getattr(self, f) for f in _TUPLE_ID_FIELDS}


_TUPLE_ID_FIELDS = tuple(f.name for f in fields(TupleId))
#: How a lock stores each TupleId field, from its annotation: ``int`` a positive integer, ``str`` a
#: non-empty string, ``int | None`` either null or a positive integer. The one table both of the
#: lock reader's checks (in bulk, and value by value) are driven by: a field added to TupleId is
#: checked by both, the same way, with no other edit (a kind not listed here is refused at import).
_TUPLE_ID_KINDS = {f.name: f.type for f in fields(TupleId)}
if not set(_TUPLE_ID_KINDS.values()) <= {"int", "str", "int | None"}:  # pragma: no cover - a new field's kind
    raise TypeError(f"TupleId has a field kind the lock reader cannot check: {_TUPLE_ID_KINDS}")
_TUPLE_ID_INTS = tuple(f for f, kind in _TUPLE_ID_KINDS.items() if kind == "int")
_TUPLE_ID_STRS = tuple(f for f, kind in _TUPLE_ID_KINDS.items() if kind == "str")
_TUPLE_ID_OPT_INTS = tuple(f for f, kind in _TUPLE_ID_KINDS.items() if kind == "int | None")
#: The string fields whose values are a closed set.
_TUPLE_ID_CHOICES = {"transport": TRANSPORTS}


def first_of_each(items: Sequence[Any], identity) -> tuple[list, list[tuple[Any, Any]]]:
    """De-duplicate ``items`` by ``identity(item)``, keeping the first of each.

    Returns (kept items in order, [(first, repeat)] for every repeat).
    """
    seen: dict[Any, Any] = {}
    kept, repeats = [], []
    for it in items:
        ident = identity(it)
        first = seen.get(ident)
        if first is None:
            seen[ident] = it
            kept.append(it)
        else:
            repeats.append((first, it))
    return kept, repeats


# ---------------------------------------------------------------------------
# Launches, ranks, tuples, the lock
# ---------------------------------------------------------------------------


@dataclass(frozen=True, eq=True)
class LaunchEntry:
    """One kernel to launch, as the build made it."""

    kind: str  # its role in the mode's sequence: "gemm", "drain", "reduce", ...
    key: str  # the action key (sha256 over every ingredient of the compile)
    blob: Digest  # the raw code object
    launch: LaunchRecord  # how FlyDSL's host code launches it
    record: Digest  # the action-cache record this entry was made from (see record_digest)

    def __post_init__(self) -> None:
        if not is_hex64(self.key):
            raise ValueError(f"a launch entry's action key must be 64 lowercase hex digits, got {self.key!r}")

    @property
    def symbol(self) -> str:
        """The kernel symbol in the code object (not unique across kernels: never a key)."""
        return self.launch.kernel


@dataclass(frozen=True)
class RankLaunches:
    """One rank's kernels for one tuple, in launch order.

    A lock read from JSON resolves ``launches`` and ``self_test`` from its rank's part on
    first access (checking and parsing that part then, once), so a runtime that serves one
    rank reads and builds the entries of that rank only.
    """

    rank: int
    launches: tuple[LaunchEntry, ...]  # what a call runs
    self_test: tuple[LaunchEntry, ...]  # what self_test runs

    def launch_keys(self) -> tuple[tuple[str, ...], tuple[str, ...]]:
        """The action keys of (launches, self_test), without building their entries."""
        pending = self.__dict__.get("_pending")
        if pending is not None:
            part, ti = pending
            return part.load()[1][ti]
        return tuple(e.key for e in self.launches), tuple(e.key for e in self.self_test)

    def __getattr__(self, name: str):
        d = self.__dict__
        if name in ("launches", "self_test"):
            pending = d.get("_pending")
            if pending is not None:
                part, ti = pending
                table, seqs = part.load()
                launch_keys, self_test_keys = seqs[ti]
                d.update(launches=table.entries(launch_keys), self_test=table.entries(self_test_keys))
                d.pop("_pending", None)  # another thread may have resolved it too (to equal values)
            if name in d:
                return d[name]
        raise AttributeError(name)


@dataclass(frozen=True)
class LockTuple:
    """One built tuple: its identity, where the manifest wrote it, its window and its ranks."""

    id: TupleId
    source: str  # "manifest.toml:tuple[0] (line 13)", for messages
    layout: WindowLayout | None  # None for gemm-only (no window)
    ranks: tuple[RankLaunches, ...]


@dataclass(frozen=True)
class LockEp:
    """One built ``[[ep]]`` entry (mori's EP dispatch/combine v2): its configuration, where the
    manifest wrote it, its window layout, and each rank's kernels in the recipe's order
    (``gemmar_aot_kernels.ep.specs``: dispatch variants, combine variants, replay variants, the
    local expert count, StdMoE's converts). ``self_test`` is empty: the op has none."""

    config: EpConfig
    source: str  # "manifest.toml:ep[0] (line 13)", for messages
    arena: Arena
    ranks: tuple[RankLaunches, ...]


@dataclass(frozen=True)
class ManifestRef:
    """The manifest a lock was built from."""

    name: str
    arch: str
    sha256: str  # of the manifest file's bytes


@dataclass(frozen=True)
class ToolchainInfo:
    """The toolchain a lock was built with: its fingerprint digest and the key ingredients it gave."""

    digest: str  # toolchain.json's digest
    ingredients: Mapping[str, Any]  # keys.toolchain_ingredients(): generator / toolchain / compiler
    profile: str | None = None  # the toolchain profile's name, when one was selected

    def __hash__(self) -> int:
        return hash((self.digest, self.profile))
