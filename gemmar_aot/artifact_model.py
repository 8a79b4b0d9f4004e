"""The artifact model: the typed hand-off between the build and the runtime. Standard library only.

Everything the build tells the runtime travels in one lock file
(``<store>/locks/<manifest>.lock.json``), and this module is the only code that reads or
writes one. The types, from the leaves up:

* :class:`Digest` -- a blob named by sha256 *and* size, as Bazel's ``Digest``: a reader
  knows how many bytes to expect before it reads them.
* :class:`TupleId` -- what makes a manifest tuple one build (mode, M, N, K, world, quant,
  wire, tile, queues, window cap). :class:`TupleKey` is what the runtime looks kernels up by
  (the identity without M and the window cap).
* :class:`WindowLayout` -- every offset of the symmetric window the kernels compiled in
  (``rules.window_layout`` returns one); :class:`CallLayout` holds the values that depend on
  the M being served.
* :class:`LaunchEntry` -- one kernel to launch: its kind, action key, blob, launch record and
  the digest of the action-cache record it was made from.
* :class:`RankLaunches` -- one rank's launches and self-test sequence;
  :class:`LockTuple` -- one tuple and its ranks; :class:`Lock` -- the whole file.

The document (schema :data:`LOCK_SCHEMA`, :meth:`Lock.to_json`) keeps what every rank
shares apart from what one rank launches:

* the head: the manifest, arch, toolchain and env; ``launch_records``, each distinct launch
  record once (without the kernel symbol, which is all that differs between ranks); and
  ``tuples``, each tuple's identity, manifest line, window layout and the ranks it was
  built for;
* ``parts``, one per rank: ``kernels``, the rank's kernels by action key (kind, blob, kernel
  symbol, record digest, launch record index), and ``launches``, for each tuple, the action
  keys the rank launches and self-tests, in order.

The file is that document as JSON Lines (:func:`encode_lock_doc`): the head on the first
line, naming each part by its :class:`Digest`, then one line per part. A rank getting ready
parses the head and its own part, a fifth of the reference lock; a part's bytes are
checked against the head's digest before they are parsed, the first time anything of it is
used (:meth:`Lock.check_parts` checks them all at once, as writing does).
:meth:`Lock.to_bytes` is the one canonical serialisation (the same lock always gives the
same bytes); reading checks every field and raises :class:`LockFileError` naming the file,
the JSON path, the value and the fix. A lock of another schema is refused, never migrated: a
newer one asks for a newer gemmar-aot, an older one for a rebuild. An artifact wheel ships
the same bytes in one zstd frame (``lock.json.zst``, :func:`compress_lock`);
:meth:`Lock.from_bytes` recognises the frame's magic number and decompresses it
(``zstandard``, imported only then), checking the frame's checksum.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass, fields, replace
from pathlib import Path
from typing import Any, Iterator, Mapping, NamedTuple, Sequence

from gemmar_aot.atomic_write import atomic_write_bytes
from gemmar_aot.canonical_json import canonical_json, canonical_json_bytes, canonical_json_line
from gemmar_aot.errors import GemmarError
from gemmar_aot.launch import PARAM_SIZES, LaunchRecord, LaunchRecordError

#: Version of the lock-file schema this gemmar-aot reads and writes.
#: 2: typed model; kernels named once by action key, launch records de-duplicated, blobs and
#: records as Digest(hash, size), the window layout split into shared and per-M values.
#: 3: JSON Lines, a head and one part per rank, so a rank reads its own kernels only.
LOCK_SCHEMA = 3

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

#: Entry-point group through which installed artifact packages announce their lock and store.
ENTRY_POINT_GROUP = "gemmar_aot.artifacts"
#: ``<store>/locks/<manifest name>`` + this is a lock file.
LOCK_SUFFIX = ".lock.json"
#: The names a lock file goes by: in a store (LOCK_SUFFIX), in an artifact wheel (``lock.json.zst``)
#: and in older wheels (``lock.json``).
LOCK_NAME_SUFFIXES = (LOCK_SUFFIX, ".json.zst", ".json")


def lock_sibling(lock_path: str | os.PathLike, suffix: str) -> Path:
    """A file that belongs to the lock at ``lock_path`` and lives beside it: the lock's name with
    its lock suffix replaced by ``suffix`` (``locks/M.lock.json`` -> ``locks/M<suffix>``,
    ``pkg/lock.json.zst`` -> ``pkg/lock<suffix>``). The record index and the signature envelope."""
    p = Path(lock_path)
    for s in LOCK_NAME_SUFFIXES:
        if p.name.endswith(s) and len(p.name) > len(s):
            return p.with_name(p.name[: -len(s)] + suffix)
    return p.with_name(p.name + suffix)

_HEX64 = re.compile(r"[0-9a-f]{64}")
_REBUILD = "rebuild the lock with `gemmar-aot build MANIFEST`"


class LockFileError(GemmarError, ValueError):
    """A lock file (or a lock being written) is malformed, or of a schema this version does not read."""


def is_hex64(s: object) -> bool:
    """Whether ``s`` is 64 lowercase hex digits (a sha256)."""
    return type(s) is str and _HEX64.fullmatch(s) is not None


# ---------------------------------------------------------------------------
# Digest
# ---------------------------------------------------------------------------


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
        return cls(hashlib.sha256(data).hexdigest(), len(data))

    def to_json(self) -> dict:
        return {"hash": self.hash, "size": self.size}

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
_TUPLE_ID_INTS = ("m", "n", "k", "world", "block_m", "block_n", "sdma_queues")
_TUPLE_ID_STRS = ("transport", "quant", "gather_dtype", "gather_transport")


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
# Window layout
# ---------------------------------------------------------------------------


@dataclass(frozen=True)
class CallLayout:
    """The window values that depend on the padded M being served (one op call)."""

    m: int
    slot: int  # counter set (rules.counter_slot)
    counter_off: int
    gather_counter_off: int
    counter_chunks: int
    slice_rows: int
    num_packs: int
    packs_per_rank: int
    largest_pack_part: int
    slice_bytes: int
    chunk_bytes: int
    gather_slice_bytes: int
    gather_scale_slice_bytes: int
    reduce_blocks: int
    lsa_stage: int
    lsa_blocks: int

    def to_json(self) -> dict:
        return {f: getattr(self, f) for f in _CALL_FIELDS}


@dataclass(frozen=True)
class WindowLayout:
    """Every offset of one op's symmetric window (``rules.window_layout``), in bytes.

    The window is ``[control | input | output | (gout | gout scales) | tmp | recv]``. All
    fields but ``call`` are the same for every M the window serves; ``call`` holds the
    values of one padded M (None for the map alone).
    """

    # configuration
    world: int
    n: int
    m_max: int
    block_m: int
    gather_dtype: str
    gather_transport: str
    max_shapes: int
    counter_capacity: int
    recv_slots: int
    gather_bands: int
    # control area
    start_off: int
    end_off: int
    flag_off: int
    counter_region_off: int
    counter_set_bytes: int
    counter_bytes: int
    lock_off: int
    lock_bytes: int
    gather_counter_region_off: int
    gather_counter_set_bytes: int
    gather_counter_bytes: int
    signal_bytes: int
    # payload
    input_off: int
    output_off: int
    output_end: int
    gout_off: int
    gout_scale_off: int
    tmp_off: int
    tmp_bytes: int
    recv_off: int
    recv_slot_bytes: int
    recv_slot_offs: tuple[int, ...]  # one per landing slot
    gout_scale_slice_offs: tuple[int, ...]  # one per peer
    window_bytes: int
    call: CallLayout | None = None

    def shared(self) -> "WindowLayout":
        """The map without the per-M values: equal for every M one window serves."""
        return self if self.call is None else replace(self, call=None)

    def flat(self) -> dict:
        """Every field by name in one dict (the per-M values included when present)."""
        out = {f: getattr(self, f) for f in _WINDOW_FIELDS}
        if self.call is not None:
            out.update(self.call.to_json())
        return out

    def to_json(self) -> dict:
        out = {f: getattr(self, f) for f in _WINDOW_FIELDS}
        out["recv_slot_offs"] = list(self.recv_slot_offs)
        out["gout_scale_slice_offs"] = list(self.gout_scale_slice_offs)
        out["call"] = None if self.call is None else self.call.to_json()
        return out


_CALL_FIELDS = tuple(f.name for f in fields(CallLayout))
_WINDOW_FIELDS = tuple(f.name for f in fields(WindowLayout) if f.name != "call")
_WINDOW_STR_FIELDS = ("gather_dtype", "gather_transport")
_WINDOW_TUPLE_FIELDS = ("recv_slot_offs", "gout_scale_slice_offs")


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


@dataclass(frozen=True)
class Lock:
    """A lock file: for every tuple and rank of a manifest, the kernels to launch, in order."""

    manifest: ManifestRef
    arch: str  # the target arch, e.g. "gfx950"
    code_object_version: int
    toolchain: ToolchainInfo
    env: Mapping[str, str | None]  # code-changing environment values the build read
    tuples: tuple[LockTuple, ...]

    def __hash__(self) -> int:
        return hash((self.manifest, self.arch, self.code_object_version, self.toolchain, self.tuples))

    # ---- queries ----

    def iter_launches(self) -> Iterator[tuple[str, LaunchEntry]]:
        """(JSON-ish path, entry) of every launch of every tuple and rank, in order."""
        for i, t in enumerate(self.tuples):
            for j, r in enumerate(t.ranks):
                for role in ("launches", "self_test"):
                    for n, e in enumerate(getattr(r, role)):
                        yield f"$.tuples[{i}].ranks[{j}].{role}[{n}]", e

    def kernels(self) -> dict[str, LaunchEntry]:
        """Action key -> entry, for every distinct kernel the lock launches (sorted by key)."""
        out: dict[str, LaunchEntry] = {}
        for _w, e in self.iter_launches():
            out.setdefault(e.key, e)
        return dict(sorted(out.items()))

    def action_keys(self) -> set[str]:
        return {e.key for _w, e in self.iter_launches()}

    def blobs(self) -> dict[str, Digest]:
        """Blob hash -> Digest of every code object the lock names."""
        return {e.blob.hash: e.blob for _w, e in self.iter_launches()}

    def blob_digests(self) -> set[str]:
        return set(self.blobs())

    def check_parts(self) -> "Lock":
        """Check every rank's part now (a lock read from bytes checks a part when it is first
        used). Raises LockFileError naming the first bad one; returns the lock."""
        for t in self.tuples:
            for r in t.ranks:
                r.launch_keys()
        return self

    # ---- (de)serialisation ----

    def to_json(self) -> dict:
        """The lock as JSON data (schema :data:`LOCK_SCHEMA`). Raises LockFileError when two
        launches with one action key disagree (one key is one kernel)."""
        kernels: dict[str, LaunchEntry] = {}
        for where, e in self.iter_launches():
            old = kernels.setdefault(e.key, e)
            if old is not e and old != e:
                raise LockFileError(f"cannot write the lock: action key {e.key} names two different "
                                    f"kernels (at {where}); one key must be one kernel")
        records: dict[bytes, int] = {}
        launch_records, table = [], {}
        for key in sorted(kernels):
            e = kernels[key]
            rj = e.launch.to_json()
            del rj["kernel"]  # the entry's symbol
            rb = canonical_json_bytes(rj)
            idx = records.get(rb)
            if idx is None:
                idx = records[rb] = len(launch_records)
                launch_records.append(rj)
            table[key] = {"kind": e.kind, "blob": e.blob.to_json(), "symbol": e.symbol, "record": e.record.to_json(),
                          "launch": idx}
        parts: dict[int, dict] = {}  # rank -> its part
        for ti, t in enumerate(self.tuples):
            for r in t.ranks:
                part = parts.setdefault(r.rank, {"rank": r.rank, "kernels": {}, "launches": []})
                seqs = r.launch_keys()
                part["launches"].append([ti, *map(list, seqs)])
                for key in (*seqs[0], *seqs[1]):
                    part["kernels"][key] = table[key]
        return {
            "schema": LOCK_SCHEMA,
            "manifest": {"name": self.manifest.name, "arch": self.manifest.arch, "sha256": self.manifest.sha256},
            "arch": self.arch,
            "code_object_version": self.code_object_version,
            "toolchain": {"digest": self.toolchain.digest, "profile": self.toolchain.profile,
                          "ingredients": _plain(self.toolchain.ingredients)},
            "env": dict(self.env),
            "launch_records": launch_records,
            "tuples": [{
                **t.id.to_json(),
                "source": t.source,
                "layout": None if t.layout is None else t.layout.to_json(),
                "ranks": [r.rank for r in t.ranks],
            } for t in self.tuples],
            "parts": [parts[r] for r in sorted(parts)],
        }

    def to_bytes(self) -> bytes:
        """The canonical bytes of this lock: the same lock always gives the same bytes."""
        try:
            return encode_lock_doc(self.to_json())
        except (TypeError, ValueError) as exc:
            if isinstance(exc, LockFileError):
                raise
            raise LockFileError(f"cannot write the lock: a value is not JSON ({exc})") from None

    @classmethod
    def from_json(cls, data: Any, where: str = "<lock>") -> "Lock":
        """Validate a lock document (:meth:`to_json`'s form: every part inline) and build the
        lock, every part checked now. Raises LockFileError naming ``where``."""
        return _Reader(where).lock(data).check_parts()

    @classmethod
    def from_bytes(cls, data: bytes | str, where: str = "<lock>") -> "Lock":
        """Parse and validate a lock's bytes (:func:`encode_lock_doc`), or those bytes in one zstd
        frame (an artifact wheel's ``lock.json.zst``; recognised by the frame's magic number).
        The head is checked now, each rank's part when it is first used (:meth:`check_parts`)."""
        if isinstance(data, str):
            data = data.encode()
        data = bytes(data)
        if data[:4] == LOCK_ZSTD_MAGIC:
            data = _decompress_lock(data, where)
        lines = data.split(b"\n")
        try:
            head = json.loads(lines[0])
        except (ValueError, UnicodeDecodeError) as exc:
            # not a head line: a lock of an older schema (indented JSON) is refused by its schema
            try:
                old = json.loads(data)
            except (ValueError, UnicodeDecodeError):
                raise LockFileError(f"{where} is not valid JSON Lines ({exc}); {_REBUILD}") from None
            return _Reader(where).lock(old, lines=[])
        return _Reader(where).lock(head, lines=lines[1:])


#: The first four bytes of a zstd frame: a lock file starting with them is compressed JSON.
LOCK_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
#: A compressed lock larger than this when decompressed is refused (the reference lock is ~0.25 MB).
MAX_LOCK_BYTES = 256 << 20


def plain_lock_bytes(data: bytes, where: str = "<lock>") -> bytes:
    """A lock file's canonical bytes: ``data`` itself, or the bytes inside its zstd frame (an artifact
    wheel's ``lock.json.zst``). What a lock's sha256 -- and its signature -- is of."""
    return _decompress_lock(data, where) if data[:4] == LOCK_ZSTD_MAGIC else data


def _decompress_lock(data: bytes, where: str) -> bytes:
    """The JSON of a zstd-compressed lock. The frame must carry its content size and checksum
    (:func:`compress_lock` writes both), so a flipped byte is a clear error, never other JSON.
    ``zstandard`` is imported here only: the model stays standard library for plain locks."""
    try:
        import zstandard
    except ImportError:  # pragma: no cover - the runtime and the build both depend on it
        raise LockFileError(f"{where} is a zstd-compressed lock and the zstandard module is not installed; "
                            f"pip install zstandard") from None
    damaged = (f"{where} is a zstd-compressed lock that does not decompress: the file is damaged or was "
               f"modified (reinstall the artifact wheel, or rebuild: `gemmar-aot wheel MANIFEST`)")
    try:
        params = zstandard.get_frame_parameters(data)
        if not params.has_checksum or params.content_size in (0, zstandard.CONTENTSIZE_UNKNOWN) \
                or params.content_size > MAX_LOCK_BYTES:
            raise LockFileError(f"{damaged} (its frame has no checksum or no plausible content size)")
        out = zstandard.ZstdDecompressor().decompress(data, max_output_size=MAX_LOCK_BYTES)
    except zstandard.ZstdError as exc:
        raise LockFileError(f"{damaged} ({exc})") from None
    if len(out) != params.content_size:  # pragma: no cover - zstd checks it
        raise LockFileError(f"{damaged} (decompressed to {len(out)} bytes, the frame says {params.content_size})")
    return out


def encode_lock_doc(doc: Mapping[str, Any]) -> bytes:
    """The file bytes of a lock document (:meth:`Lock.to_json`'s form, its parts inline): the
    head on one line with each part replaced by ``{"rank", "hash", "size"}`` naming that
    part's line, then the parts, one line each, all canonical (``canonical_json_line``).

    Encodes whatever it is given, without checking it (tests write damaged locks with it);
    :meth:`Lock.to_bytes` is what writes a valid one."""
    parts = [canonical_json_line(p) for p in doc["parts"]]
    head = {**doc, "parts": [{"rank": p.get("rank") if isinstance(p, Mapping) else None, **Digest.of(b).to_json()}
                             for p, b in zip(doc["parts"], parts)]}
    return b"\n".join([canonical_json_line(head), *parts, b""])


def decode_lock_doc(data: bytes) -> dict:
    """The document of a lock file's bytes (plain or zstd), parts inline: what :func:`encode_lock_doc`
    encoded. Unchecked, for tools and tests that look inside; :meth:`Lock.from_bytes` reads a lock."""
    if data[:4] == LOCK_ZSTD_MAGIC:
        data = _decompress_lock(data, "<lock>")
    head, *parts = (json.loads(line) for line in data.split(b"\n") if line)
    return {**head, "parts": parts}


def compress_lock(lock: "Lock", level: int = 19) -> bytes:
    """``lock``'s canonical bytes in one zstd frame with its content size and checksum: what
    :meth:`Lock.from_bytes` (hence :func:`read_lock`) reads back. Deterministic for a given libzstd."""
    import zstandard

    return zstandard.ZstdCompressor(level=level, write_checksum=True, write_content_size=True).compress(
        lock.to_bytes())


#: Record fields that differ between two compiles of one key (timings): a record's digest leaves
#: them out, so the same manifest and toolchain give the same lock in any store.
RECORD_VOLATILE_FIELDS = ("compile_seconds",)


#: The members of an action-cache record the runtime reads when it binds a lock entry to its
#: record (the envelope, the launch record, the spec); the rest -- the ``ingredients`` and the
#: kernel ``metadata``, most of a record's bytes -- it never reads. :func:`record_digest`
#: hashes the two apart, so a reader can check a record whole and parse only what it reads.
RECORD_READ_MEMBERS = ("blob", "key", "launch", "schema", "spec")


def record_halves(record: Mapping[str, Any]) -> tuple[bytes, bytes]:
    """The canonical JSON (``canonical_json``) of a record's :data:`RECORD_READ_MEMBERS` and of
    its other members but :data:`RECORD_VOLATILE_FIELDS`: what :func:`record_digest` hashes."""
    read = {k: record[k] for k in RECORD_READ_MEMBERS if k in record}
    rest = {k: v for k, v in record.items() if k not in RECORD_READ_MEMBERS and k not in RECORD_VOLATILE_FIELDS}
    return canonical_json(read).encode(), canonical_json(rest).encode()


def record_digest_of_halves(read: bytes, rest: bytes) -> Digest:
    """The record digest of a record whose halves (:func:`record_halves`) are these bytes: the
    Digest of ``{"read": sha256(read), "rest": sha256(rest)}`` in canonical JSON."""
    return Digest.of(b'{"read":"' + hashlib.sha256(read).hexdigest().encode() + b'","rest":"'
                     + hashlib.sha256(rest).hexdigest().encode() + b'"}')


def record_digest(record: Mapping[str, Any]) -> Digest:
    """The digest a lock names for an action-cache record (timings left out, so the same
    manifest and toolchain give the same lock in any store).

    It commits to every byte of the record, as a hash of the whole would, in two halves
    (:func:`record_halves`): the members the runtime reads, and the rest. A record index
    line carries both halves' bytes; the runtime hashes both (C speed) but parses only the
    first (:mod:`gemmar_aot.store.record_index`)."""
    return record_digest_of_halves(*record_halves(record))


def read_lock(path: str | os.PathLike) -> Lock:
    """Read and validate a lock file (plain JSON, or zstd-compressed JSON as an artifact wheel
    ships it). Raises LockFileError naming the path."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise LockFileError(f"no lock file at {path}; run the build that writes it "
                            f"(gemmar-aot build MANIFEST)") from None
    except IsADirectoryError:
        raise LockFileError(f"{path} is a directory, not a lock file") from None
    return Lock.from_bytes(data, str(path))


def write_lock(path: str | os.PathLike, lock: Lock) -> Path:
    """Write ``lock`` to ``path`` atomically (fsync of file and directory), canonically, after checking
    that the bytes read back as a valid lock (raises LockFileError and writes nothing otherwise).
    Returns the path."""
    if not isinstance(lock, Lock):
        raise TypeError(f"write_lock takes a Lock, got {type(lock).__name__}")
    path = Path(path)
    data = lock.to_bytes()
    Lock.from_bytes(data, f"{path} (not written)")  # never publish a lock the reader would refuse
    atomic_write_bytes(path, data)
    return path


def lock_file_path(store_root: str | os.PathLike, manifest_name: str, profile: str | None = None) -> Path:
    """Where the build of ``manifest_name`` into ``store_root`` writes its lock file:
    ``locks/<manifest>.lock.json``, or ``locks/<manifest>.<profile>.lock.json`` for a toolchain
    profile other than the default, so one store holds several profiles' locks side by side."""
    suffix = "" if profile in (None, "default") else f".{profile}"
    return Path(store_root) / "locks" / f"{manifest_name}{suffix}{LOCK_SUFFIX}"


def _plain(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


# ---------------------------------------------------------------------------
# Validation
#
# Every check has a fast path made of C-level operations (a key-set comparison, a
# set of element types) and, only when that fails, a slow path that finds the first
# offending value and names it. Reading the reference lock is dominated by json.loads.
# ---------------------------------------------------------------------------

_TOP = ("schema", "manifest", "arch", "code_object_version", "toolchain", "env", "launch_records", "tuples",
        "parts")
_PART_KEYS = ("rank", "kernels", "launches")
_PART_REF_KEYS = ("rank", "hash", "size")
_TUPLE_KEYS = (*_TUPLE_ID_FIELDS, "source", "layout", "ranks")
_KERNEL_KEYS = ("kind", "blob", "symbol", "record", "launch")
_RECORD_KEYS = ("params", "args", "kernel_args", "kernel_arg_types", "program", "grid", "block", "stream_param")
_ARG_KEYS = ("name", "kind", "params", "dtype")
_DIGEST_KEYS = ("hash", "size")
_ARG_KINDS = ("tensor", "i32", "i64", "stream")
_PARAM_TYPES = tuple(PARAM_SIZES)
_WINDOW_KEYS = (*_WINDOW_FIELDS, "call")
_WINDOW_INT_FIELDS = tuple(f for f in _WINDOW_FIELDS if f not in _WINDOW_STR_FIELDS + _WINDOW_TUPLE_FIELDS)
_KEYSETS: dict[tuple, frozenset] = {}
_INT = frozenset({int})
_STR = frozenset({str})
_STR_INT = frozenset({str, int})


def _all_hex64(strs: list[str]) -> bool:
    """Whether every string is 64 lowercase hex digits (two C passes over all of them at once)."""
    if set(map(len, strs)) != {64}:
        return False
    joined = "".join(strs)
    try:
        return bytes.fromhex(joined).hex() == joined  # .hex() is lowercase without spaces
    except ValueError:
        return False


def _validated(cls, **values):
    """An instance of frozen dataclass ``cls`` from values the reader has already checked in bulk
    (skips the per-instance checks of ``__post_init__``, which dominate reading a large lock)."""
    obj = object.__new__(cls)
    obj.__dict__.update(values)
    return obj


def _keyset(keys: tuple) -> frozenset:
    ks = _KEYSETS.get(keys)
    if ks is None:
        ks = _KEYSETS[keys] = frozenset(keys)
    return ks


def _show(v: Any) -> str:
    s = repr(v)
    return s if len(s) <= 80 else s[:77] + "..."


def _type_name(v: Any) -> str:
    return {dict: "an object", list: "a list", str: "a string", int: "an integer", float: "a number",
            bool: "a boolean", type(None): "null"}.get(type(v), type(v).__name__)


def _types(xs) -> frozenset:
    return frozenset(map(type, xs))


class _KernelTable:
    """A lock's kernels by action key: validated JSON entries, turned into LaunchEntry on first use."""

    def __init__(self, raw: dict[str, dict], records: list[LaunchRecord]):
        self.raw = raw
        self.records = records
        self.entries_by_key: dict[str, LaunchEntry] = {}
        self.by_symbol: dict[tuple[int, str], LaunchRecord] = {}

    @classmethod
    def of(cls, entries: dict[str, LaunchEntry]) -> "_KernelTable":
        t = cls(dict.fromkeys(entries), [])
        t.entries_by_key.update(entries)
        return t

    def entry(self, key: str) -> LaunchEntry:
        e = self.entries_by_key.get(key)
        if e is None:
            k = self.raw[key]
            idx, symbol = k["launch"], k["symbol"]
            launch = self.by_symbol.get((idx, symbol))
            if launch is None:
                launch = self.by_symbol[idx, symbol] = replace(self.records[idx], kernel=symbol)
            b, r = k["blob"], k["record"]
            e = self.entries_by_key[key] = _validated(
                LaunchEntry, kind=k["kind"], key=key, blob=_validated(Digest, hash=b["hash"], size=b["size"]),
                launch=launch, record=_validated(Digest, hash=r["hash"], size=r["size"]))
        return e

    def entries(self, keys: tuple[str, ...]) -> tuple[LaunchEntry, ...]:
        return tuple(self.entry(k) for k in keys)


class _LockPart:
    """One rank's part of a lock: checked (against the digest the head names, when read from
    bytes), parsed and validated on first use, then kept: ``(kernel table, {tuple index:
    (launch keys, self-test keys)})``."""

    __slots__ = ("reader", "index", "rank", "ref", "data", "records", "tuples", "got")

    def __init__(self, reader: "_Reader", index: int, rank: int, ref: Digest | None, data: Any,
                 records: list[LaunchRecord]):
        self.reader, self.index, self.rank, self.ref, self.data = reader, index, rank, ref, data
        self.records = records
        self.tuples: set[int] = set()  # the tuples whose head lists this rank
        self.got: tuple[_KernelTable, dict[int, tuple[tuple[str, ...], tuple[str, ...]]]] | None = None

    def load(self) -> tuple["_KernelTable", dict[int, tuple[tuple[str, ...], tuple[str, ...]]]]:
        # Two threads may both get here first: each parses the same bytes to equal values (the
        # bytes are kept, never cleared under another reader), and the first result stays.
        got = self.got
        if got is None:
            got = self.reader.part(self)
            if self.got is None:
                self.got = got
            got = self.got
        return got


class _Reader:
    """Builds typed values from parsed lock JSON; every failure names the file, the JSON path,
    the value and the fix."""

    def __init__(self, where: str):
        self.where = where

    def fail(self, path: str, msg: str, fix: str = _REBUILD) -> LockFileError:
        return LockFileError(f"{self.where}: {path} {msg}; {fix}")

    # ---- shapes and scalars (each returns its value or raises naming it) ----

    def obj(self, v: Any, path: str, keys: tuple) -> dict:
        if type(v) is dict and v.keys() == _keyset(keys):
            return v
        if type(v) is not dict:
            raise self.fail(path, f"is {_type_name(v)} ({_show(v)}), expected an object")
        missing = [k for k in keys if k not in v]
        if missing:
            raise self.fail(path, f"has no {', '.join(repr(k) for k in missing)} (a required field)")
        extra = sorted(k for k in v if k not in keys)
        raise self.fail(path, f"has unknown field(s) {', '.join(repr(k) for k in extra)} for lock schema "
                              f"{LOCK_SCHEMA}", "it was edited or written by another gemmar-aot; " + _REBUILD)

    def list(self, v: Any, path: str) -> list:
        if type(v) is not list:
            raise self.fail(path, f"is {_type_name(v)} ({_show(v)}), expected a list")
        return v

    def int(self, v: Any, path: str, lo: int = 0) -> int:
        if type(v) is int and v >= lo:
            return v
        if type(v) is not int:
            raise self.fail(path, f"is {_type_name(v)} ({_show(v)}), expected an integer")
        raise self.fail(path, f"is {v}, expected an integer >= {lo}")

    def ints(self, vs: Sequence[Any], paths, lo: int = 0) -> None:
        """Every value an integer >= lo (``paths(i)`` names the i-th)."""
        if vs and (_types(vs) != _INT or min(vs) < lo):
            for i, v in enumerate(vs):
                self.int(v, paths(i), lo)

    def opt_int(self, v: Any, path: str, lo: int = 0) -> int | None:
        return None if v is None else self.int(v, path, lo)

    def str(self, v: Any, path: str, choices: Sequence[str] = (), empty: bool = False) -> str:
        if type(v) is str and (v or empty) and (not choices or v in choices):
            return v
        if type(v) is not str:
            raise self.fail(path, f"is {_type_name(v)} ({_show(v)}), expected a string")
        if not v and not empty:
            raise self.fail(path, "is an empty string")
        raise self.fail(path, f"is {v!r}, expected one of {', '.join(choices)}")

    def strs(self, vs: list, path: str, choices: tuple = ()) -> None:
        if _types(vs) - _STR or (choices and not _keyset(choices).issuperset(vs)):
            for i, v in enumerate(vs):
                self.str(v, f"{path}[{i}]", choices, empty=True)

    def opt_str(self, v: Any, path: str) -> str | None:
        return None if v is None else self.str(v, path)

    def hex64(self, v: Any, path: str, what: str = "a sha256") -> str:
        if not is_hex64(v):
            raise self.fail(path, f"is {_show(v)}, expected {what} (64 lowercase hex digits)")
        return v

    def digest(self, v: Any, path: str) -> Digest:
        if type(v) is dict and v.keys() == _keyset(_DIGEST_KEYS):
            try:
                return Digest(v["hash"], v["size"])  # validates
            except ValueError:
                pass
        o = self.obj(v, path, _DIGEST_KEYS)
        self.hex64(o["hash"], f"{path}.hash")
        self.int(o["size"], f"{path}.size")
        raise AssertionError("unreachable: an invalid digest passed every check")

    def json_value(self, v: Any, path: str) -> Any:
        t = type(v)
        if t is dict:
            for k, x in v.items():
                self.json_value(x, f"{path}.{k}")
        elif t is list:
            for i, x in enumerate(v):
                self.json_value(x, f"{path}[{i}]")
        elif t is float:
            raise self.fail(path, f"is {v!r}; a lock holds no fractional numbers")
        return v

    # ---- the lock ----

    def lock(self, v: Any, lines: list[bytes] | None = None) -> Lock:
        """The lock of head ``v``: with ``lines`` (the file's lines after the head) the parts are
        digests naming them; without, the parts are inline (:meth:`Lock.to_json`'s form)."""
        if type(v) is not dict:
            raise LockFileError(f"{self.where}: a lock file holds a JSON object, this holds {_type_name(v)}; "
                                f"{_REBUILD}")
        schema = v.get("schema")
        if type(schema) is not int:
            raise LockFileError(f"{self.where}: $.schema is {_show(schema)}, not an integer lock schema: it is not a "
                                f"gemmar-aot lock file (this gemmar-aot reads lock schema {LOCK_SCHEMA})")
        if schema > LOCK_SCHEMA:
            raise LockFileError(f"{self.where}: lock schema {schema} was written by a newer gemmar-aot; this one "
                                f"reads lock schema {LOCK_SCHEMA}: upgrade gemmar-aot")
        if 1 <= schema < LOCK_SCHEMA:
            raise LockFileError(f"{self.where}: lock schema {schema} was written by an older gemmar-aot; this one "
                                f"reads lock schema {LOCK_SCHEMA} and does not convert old locks: rebuild it "
                                f"with `gemmar-aot build MANIFEST` (the store's kernels are reused, nothing is "
                                f"recompiled)")
        if schema != LOCK_SCHEMA:
            raise LockFileError(f"{self.where}: unknown lock schema {schema} (this gemmar-aot reads lock schema "
                                f"{LOCK_SCHEMA}); {_REBUILD}")
        self.obj(v, "$", _TOP)
        m = self.obj(v["manifest"], "$.manifest", ("name", "arch", "sha256"))
        manifest = ManifestRef(self.str(m["name"], "$.manifest.name"), self.str(m["arch"], "$.manifest.arch"),
                               self.hex64(m["sha256"], "$.manifest.sha256"))
        tc = self.obj(v["toolchain"], "$.toolchain", ("digest", "profile", "ingredients"))
        ingr = tc["ingredients"]
        if type(ingr) is not dict:
            raise self.fail("$.toolchain.ingredients", f"is {_type_name(ingr)}, expected an object")
        for k, sec in ingr.items():
            if type(sec) is not dict:
                raise self.fail(f"$.toolchain.ingredients.{k}", f"is {_type_name(sec)}, expected an object")
            self.json_value(sec, f"$.toolchain.ingredients.{k}")
        toolchain = ToolchainInfo(self.hex64(tc["digest"], "$.toolchain.digest"), ingr,
                                  self.opt_str(tc["profile"], "$.toolchain.profile"))
        env = v["env"]
        if type(env) is not dict:
            raise self.fail("$.env", f"is {_type_name(env)}, expected an object")
        for k, x in env.items():
            if x is not None and type(x) is not str:
                raise self.fail(f"$.env.{k}", f"is {_type_name(x)} ({_show(x)}), expected a string or null")
        records = [self.launch_record(r, f"$.launch_records[{i}]")
                   for i, r in enumerate(self.list(v["launch_records"], "$.launch_records"))]
        parts = self.parts(v["parts"], lines, records)
        tuples = tuple(self.tuple(t, f"$.tuples[{i}]", i, parts)
                       for i, t in enumerate(self.list(v["tuples"], "$.tuples")))
        for part in parts.values():
            if not part.tuples:
                raise self.fail(f"$.parts[{part.index}]", f"is rank {part.rank}'s part, but no tuple lists rank "
                                                          f"{part.rank}")
        return Lock(manifest=manifest, arch=self.str(v["arch"], "$.arch"),
                    code_object_version=self.int(v["code_object_version"], "$.code_object_version", 1),
                    toolchain=toolchain, env=dict(env), tuples=tuples)

    def parts(self, v: Any, lines: list[bytes] | None, records: list[LaunchRecord]) -> dict[int, _LockPart]:
        """Rank -> its part, from the head's ``parts``: references to ``lines`` (checked against
        them when loaded), or inline documents."""
        out: dict[int, _LockPart] = {}
        self.list(v, "$.parts")
        if lines is not None:
            if lines[-1:] != [b""] or len(lines) != len(v) + 1:
                raise self.fail("$.parts", f"names {len(v)} part(s), the file has {max(len(lines) - 1, 0)} line(s) "
                                           f"after the head" + ("" if lines[-1:] == [b""] else
                                                                " and does not end in a newline (truncated?)"))
        for i, x in enumerate(v):
            path = f"$.parts[{i}]"
            if lines is not None:
                o = self.obj(x, path, _PART_REF_KEYS)
                rank = self.int(o["rank"], f"{path}.rank")
                ref = self.digest({"hash": o["hash"], "size": o["size"]}, path)
                part = _LockPart(self, i, rank, ref, lines[i], records)
            else:
                o = self.obj(x, path, _PART_KEYS)
                rank = self.int(o["rank"], f"{path}.rank")
                part = _LockPart(self, i, rank, None, o, records)
            if out and rank <= max(out):
                raise self.fail(f"{path}.rank", f"is {rank}: parts are in increasing rank order, one per rank")
            out[rank] = part
        return out

    def part(self, p: _LockPart) -> tuple[_KernelTable, dict[int, tuple[tuple[str, ...], tuple[str, ...]]]]:
        """Check, parse and validate part ``p`` (see :class:`_LockPart`)."""
        path = f"$.parts[{p.index}]"
        v = p.data
        if p.ref is not None:
            if len(v) != p.ref.size or hashlib.sha256(v).hexdigest() != p.ref.hash:
                got = Digest.of(v)
                raise LockFileError(f"{self.where}: rank {p.rank}'s part (line {p.index + 2}) is {got}, the head "
                                    f"names {p.ref}: the file is damaged or was edited; {_REBUILD}")
            try:
                v = json.loads(v)
            except (ValueError, UnicodeDecodeError) as exc:
                raise self.fail(path, f"(line {p.index + 2}) is not JSON ({exc})") from None
            self.obj(v, path, _PART_KEYS)
            if v["rank"] != p.rank:
                raise self.fail(f"{path}.rank", f"is {_show(v['rank'])}, the head names the part of rank {p.rank}")
        table = self.kernels(v["kernels"], p.records, f"{path}.kernels")
        seqs: dict[int, tuple[tuple[str, ...], tuple[str, ...]]] = {}
        for j, item in enumerate(self.list(v["launches"], f"{path}.launches")):
            ip = f"{path}.launches[{j}]"
            if type(item) is not list or len(item) != 3:
                raise self.fail(ip, f"is {_show(item)}, expected [tuple index, [action keys launched], "
                                    f"[action keys self-tested]]")
            ti = self.int(item[0], f"{ip}[0]")
            if ti not in p.tuples or ti in seqs:
                raise self.fail(f"{ip}[0]", f"is {ti}: " + ("a repeated tuple" if ti in seqs else
                                                            f"$.tuples[{ti}] does not list rank {p.rank}"))
            seqs[ti] = (self.refs(item[1], f"{ip}[1]", table, f"{path}.kernels"),
                        self.refs(item[2], f"{ip}[2]", table, f"{path}.kernels"))
        missing = sorted(p.tuples - seqs.keys())
        if missing:
            raise self.fail(f"{path}.launches", f"has nothing for tuple(s) {missing}, which list rank {p.rank}")
        return table, seqs

    def kernels(self, v: Any, records: list[LaunchRecord], path: str) -> _KernelTable:
        if type(v) is not dict:
            raise self.fail(path, f"is {_type_name(v)}, expected an object (action key -> kernel)")
        if self.kernels_valid(v, records):
            return _KernelTable(v, records)
        return _KernelTable.of(self.kernels_slow(v, records, path))

    def kernels_valid(self, v: dict, records: list[LaunchRecord]) -> bool:
        """Every check at once (one regex over all digests, type sets); False when any fails."""
        ks, ds = _keyset(_KERNEL_KEYS), _keyset(_DIGEST_KEYS)
        try:
            entries = list(v.values())
            if any([type(k) is not dict or k.keys() != ks for k in entries]):
                return False
            blobs = [k["blob"] for k in entries]
            recs = [k["record"] for k in entries]
            if any([type(d) is not dict or d.keys() != ds for d in blobs + recs]):
                return False
            hashes = [*v, *(d["hash"] for d in blobs), *(d["hash"] for d in recs)]
            sizes = [*(d["size"] for d in blobs), *(d["size"] for d in recs)]
            kinds = [k["kind"] for k in entries]
            symbols = [k["symbol"] for k in entries]
            idx = [k["launch"] for k in entries]
            return not entries or bool(
                _types(hashes) == _STR and _all_hex64(hashes)
                and _types(sizes) == _INT and min(sizes) >= 0
                and _types(kinds) == _STR and all(kinds) and _types(symbols) == _STR and all(symbols)
                and _types(idx) == _INT and min(idx) >= 0 and max(idx) < len(records))
        except TypeError:  # e.g. an unhashable value
            return False

    def kernels_slow(self, v: dict, records: list[LaunchRecord], where: str) -> dict[str, LaunchEntry]:
        """One entry at a time: finds the first bad value and names it."""
        out = {}
        n = len(records)
        keyset = _keyset(_KERNEL_KEYS)
        by_symbol: dict[tuple[int, str], LaunchRecord] = {}
        for key, k in v.items():
            path = f"{where}.{key}"
            if type(k) is not dict or k.keys() != keyset:
                self.obj(k, path, _KERNEL_KEYS)
            idx = k["launch"]
            if type(idx) is not int or not 0 <= idx < n:
                raise self.fail(f"{path}.launch", f"is {_show(idx)}, expected an index into $.launch_records "
                                                  f"(0..{n - 1})")
            kind = self.str(k["kind"], f"{path}.kind")
            symbol = self.str(k["symbol"], f"{path}.symbol")
            launch = by_symbol.get((idx, symbol))
            if launch is None:
                launch = by_symbol[idx, symbol] = replace(records[idx], kernel=symbol)
            blob, record = self.digest(k["blob"], f"{path}.blob"), self.digest(k["record"], f"{path}.record")
            try:
                entry = LaunchEntry(kind, key, blob, launch, record)
            except ValueError:  # the action key
                raise self.fail(where, f"has key {_show(key)}, expected an action key (64 lowercase hex "
                                       f"digits)") from None
            out[key] = entry
        return out

    def launch_record(self, v: Any, path: str) -> LaunchRecord:
        o = self.obj(v, path, _RECORD_KEYS)
        self.strs(self.list(o["params"], f"{path}.params"), f"{path}.params", _PARAM_TYPES)
        self.strs(self.list(o["kernel_arg_types"], f"{path}.kernel_arg_types"), f"{path}.kernel_arg_types",
                  _PARAM_TYPES)
        self.strs(self.list(o["kernel_args"], f"{path}.kernel_args"), f"{path}.kernel_args")
        nparams = len(o["params"])
        for i, a in enumerate(self.list(o["args"], f"{path}.args")):
            ap = f"{path}.args[{i}]"
            self.obj(a, ap, _ARG_KEYS)
            self.str(a["name"], f"{ap}.name")
            self.str(a["kind"], f"{ap}.kind", _ARG_KINDS)
            self.str(a["dtype"], f"{ap}.dtype", empty=True)
            ps = self.list(a["params"], f"{ap}.params")
            if ps and (_types(ps) != _INT or min(ps) < 0 or max(ps) >= nparams):
                for j, p in enumerate(ps):
                    if type(p) is not int or not 0 <= p < nparams:
                        raise self.fail(f"{ap}.params[{j}]", f"is {_show(p)}, expected a host parameter index "
                                                             f"(0..{nparams - 1})")
        program = self.list(o["program"], f"{path}.program")
        for i, ins in enumerate(program):
            if type(ins) is not list or len(ins) < 2 or not _STR_INT.issuperset(map(type, ins)):
                raise self.fail(f"{path}.program[{i}]", f"is {_show(ins)}, expected [result, op, operands...] of "
                                                        f"strings and integers")
        for what in ("grid", "block"):
            g = self.list(o[what], f"{path}.{what}")
            if len(g) != 3 or not _STR_INT.issuperset(map(type, g)):
                raise self.fail(f"{path}.{what}", f"is {_show(g)}, expected three integers or program values")
        sp = self.int(o["stream_param"], f"{path}.stream_param")
        if sp >= nparams:
            raise self.fail(f"{path}.stream_param", f"is {sp}, but the record has {nparams} host parameters")
        try:
            return LaunchRecord.from_json({**o, "kernel": ""})  # each kernel entry gives its symbol
        except LaunchRecordError as exc:
            raise self.fail(path, f"is not a launch record ({exc})") from None

    def tuple(self, v: Any, path: str, ti: int, parts: dict[int, _LockPart]) -> LockTuple:
        t = self.tuple_fast(v, ti, parts)
        if t is None:
            t = self.tuple_slow(v, path, ti, parts)
        for r in t.ranks:
            parts[r.rank].tuples.add(ti)
        return t

    def tuple_fast(self, v: Any, ti: int, parts: dict[int, _LockPart]) -> LockTuple | None:
        """The common case checked in bulk (type sets, one subset test); None when anything is off."""
        try:
            if type(v) is not dict or v.keys() != _keyset(_TUPLE_KEYS):
                return None
            ints = [v[f] for f in _TUPLE_ID_INTS]
            strs = [v[f] for f in _TUPLE_ID_STRS]
            m_max = v["m_max"]
            if (_types(ints) != _INT or min(ints) < 1 or _types(strs) != _STR or not all(strs)
                    or v["transport"] not in TRANSPORTS or type(v["source"]) is not str
                    or not (m_max is None or (type(m_max) is int and m_max >= 1))):
                return None
            tid = _validated(TupleId, **{f: v[f] for f in _TUPLE_ID_FIELDS})
            lay = v["layout"]
            if (lay is None) == tid.collective:
                return None
            layout = None if lay is None else self.window_fast(lay)
            if lay is not None and (layout is None or layout.call is None or layout.call.m != tid.m or (
                    layout.world, layout.n, layout.block_m, layout.gather_dtype, layout.gather_transport) != (
                    tid.world, tid.n, tid.block_m, tid.gather_dtype, tid.gather_transport)):
                return None
            ranks = v["ranks"]
            if type(ranks) is not list or ranks and (_types(ranks) != _INT or len(set(ranks)) != len(ranks)
                                                     or not parts.keys() >= set(ranks) or max(ranks) >= tid.world):
                return None
        except TypeError:  # an unhashable value in a type or key set
            return None
        return _validated(LockTuple, id=tid, source=v["source"], layout=layout, ranks=tuple(
            _validated(RankLaunches, rank=rank, _pending=(parts[rank], ti)) for rank in ranks))

    def window_fast(self, v: Any) -> WindowLayout | None:
        if type(v) is not dict or v.keys() != _keyset(_WINDOW_KEYS):
            return None
        ints = [v[f] for f in _WINDOW_INT_FIELDS]
        seqs = [v[f] for f in _WINDOW_TUPLE_FIELDS]
        strs = [v[f] for f in _WINDOW_STR_FIELDS]
        if (_types(ints) != _INT or min(ints) < 0 or _types(strs) != _STR or not all(strs)
                or _types(seqs) != {list} or any([x and (_types(x) != _INT or min(x) < 0) for x in seqs])):
            return None
        c = v["call"]
        call = None
        if c is not None:
            if type(c) is not dict or c.keys() != _keyset(_CALL_FIELDS):
                return None
            cv = [c[f] for f in _CALL_FIELDS]
            if _types(cv) != _INT or min(cv) < 0:
                return None
            call = _validated(CallLayout, **c)
        return _validated(WindowLayout, **{f: v[f] for f in _WINDOW_INT_FIELDS + _WINDOW_STR_FIELDS},
                          **{f: tuple(v[f]) for f in _WINDOW_TUPLE_FIELDS}, call=call)

    def tuple_slow(self, v: Any, path: str, ti: int, parts: dict[int, _LockPart]) -> LockTuple:
        """One value at a time: finds the first bad one and names it."""
        self.obj(v, path, _TUPLE_KEYS)
        s, i = self.str, self.int
        tid = TupleId(
            transport=s(v["transport"], f"{path}.transport", TRANSPORTS), m=i(v["m"], f"{path}.m", 1),
            n=i(v["n"], f"{path}.n", 1), k=i(v["k"], f"{path}.k", 1), world=i(v["world"], f"{path}.world", 1),
            quant=s(v["quant"], f"{path}.quant"), gather_dtype=s(v["gather_dtype"], f"{path}.gather_dtype"),
            gather_transport=s(v["gather_transport"], f"{path}.gather_transport"),
            block_m=i(v["block_m"], f"{path}.block_m", 1), block_n=i(v["block_n"], f"{path}.block_n", 1),
            sdma_queues=i(v["sdma_queues"], f"{path}.sdma_queues", 1),
            m_max=self.opt_int(v["m_max"], f"{path}.m_max", 1))
        layout = None if v["layout"] is None else self.window(v["layout"], f"{path}.layout")
        if tid.collective and layout is None:
            raise self.fail(f"{path}.layout", f"is null, but a {tid.transport} tuple has a window")
        if not tid.collective and layout is not None:
            raise self.fail(f"{path}.layout", f"is not null, but a {tid.transport} tuple has no window")
        if layout is not None:
            for f in ("world", "n", "block_m", "gather_dtype", "gather_transport"):
                if getattr(layout, f) != getattr(tid, f):
                    raise self.fail(f"{path}.layout.{f}", f"is {getattr(layout, f)!r}, but the tuple's {f} is "
                                                          f"{getattr(tid, f)!r}")
            if layout.call is None or layout.call.m != tid.m:
                raise self.fail(f"{path}.layout.call", f"does not describe the tuple's M={tid.m}")
        ranks, seen = [], set()
        for j, r in enumerate(self.list(v["ranks"], f"{path}.ranks")):
            rp = f"{path}.ranks[{j}]"
            rank = i(r, rp)
            if rank >= tid.world or rank in seen or rank not in parts:
                raise self.fail(rp, f"is {rank}: " + (f"the world has {tid.world} ranks" if rank >= tid.world else
                                                      "a repeated rank" if rank in seen else
                                                      f"$.parts has no part for rank {rank}"))
            seen.add(rank)
            ranks.append(_validated(RankLaunches, rank=rank, _pending=(parts[rank], ti)))
        return LockTuple(id=tid, source=self.str(v["source"], f"{path}.source", empty=True), layout=layout,
                         ranks=tuple(ranks))

    def refs(self, v: Any, path: str, kernels: "_KernelTable", table_path: str) -> tuple[str, ...]:
        """The action keys of a launch sequence, each checked to name a kernel of ``kernels``."""
        keys = tuple(self.list(v, path))
        try:
            if kernels.raw.keys() >= set(keys):
                return keys
        except TypeError:
            pass
        for n, key in enumerate(v):
            if type(key) is not str or key not in kernels.raw:
                raise self.fail(f"{path}[{n}]", f"is {_show(key)}, which names no kernel in {table_path}")
        raise AssertionError("unreachable: a bad reference passed every check")

    def window(self, v: Any, path: str) -> WindowLayout:
        o = self.obj(v, path, _WINDOW_KEYS)
        self.ints([o[f] for f in _WINDOW_INT_FIELDS], lambda n: f"{path}.{_WINDOW_INT_FIELDS[n]}")
        vals: dict[str, Any] = {f: o[f] for f in _WINDOW_INT_FIELDS}
        for f in _WINDOW_STR_FIELDS:
            vals[f] = self.str(o[f], f"{path}.{f}")
        for f in _WINDOW_TUPLE_FIELDS:
            xs = self.list(o[f], f"{path}.{f}")
            self.ints(xs, lambda n, f=f: f"{path}.{f}[{n}]")
            vals[f] = tuple(xs)
        c = o["call"]
        if c is not None:
            self.obj(c, f"{path}.call", _CALL_FIELDS)
            cv = [c[f] for f in _CALL_FIELDS]
            self.ints(cv, lambda n: f"{path}.call.{_CALL_FIELDS[n]}")
            vals["call"] = CallLayout(*cv)
        return WindowLayout(**vals)
