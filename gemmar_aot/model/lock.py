"""The lock: :class:`Lock` (the whole file), its one reader (:func:`read_lock`,
:meth:`Lock.from_bytes`) and its one writer (:func:`write_lock`), and where a lock's files live."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Mapping

from gemmar_aot.util.atomic_write import atomic_write_bytes
from gemmar_aot.util.canonical_json import canonical_json_bytes
from gemmar_aot.model.types import Digest, LaunchEntry, LockEp, LockTuple, ManifestRef, ToolchainInfo
from gemmar_aot.model.schema import LOCK_SCHEMA, READ_SCHEMAS, LockFileError, LockSchemaError, _REBUILD, top_keys
from gemmar_aot.model.lock_codec import LOCK_ZSTD_MAGIC, decompress_lock, encode_lock_doc
from gemmar_aot.model.validate import DocReader, show_value, type_name

if TYPE_CHECKING:  # a pod whose lock has no hipcc or jitv2 item never imports them
    from gemmar_aot.model.hipcc import CodeObjectEntry, LockHipcc
    from gemmar_aot.model.jitv2_lock import LockJitV2

#: Entry-point group through which installed artifact packages announce their lock and store.
ENTRY_POINT_GROUP = "gemmar_aot.artifacts"


@dataclass(frozen=True)
class Lock:
    """A lock file: for every tuple and rank of a manifest, the kernels to launch, in order."""

    manifest: ManifestRef
    arch: str  # the target arch, e.g. "gfx950"
    code_object_version: int
    toolchain: ToolchainInfo
    env: Mapping[str, str | None]  # code-changing environment values the build read
    tuples: tuple[LockTuple, ...]
    eps: tuple[LockEp, ...] = ()  # the [[ep]] entries
    hipcc: tuple["LockHipcc", ...] = ()  # mori's hipcc-JIT code objects ([[hipcc]] entries)
    jitv2: tuple["LockJitV2", ...] = ()  # mori's JIT v2 code objects (HIP-backend [[ep]] entries)

    def __hash__(self) -> int:
        return hash((self.manifest, self.arch, self.code_object_version, self.toolchain, self.tuples, self.eps,
                     self.hipcc, self.jitv2))

    # ---- queries ----

    def iter_launches(self) -> Iterator[tuple[str, LaunchEntry]]:
        """(JSON-ish path, entry) of every launch of every tuple and rank, in order."""
        for i, t in enumerate(self.tuples):
            for j, r in enumerate(t.ranks):
                for role in ("launches", "self_test"):
                    for n, e in enumerate(getattr(r, role)):
                        yield f"$.tuples[{i}].ranks[{j}].{role}[{n}]", e
        for i, ep in enumerate(self.eps):
            for j, r in enumerate(ep.ranks):
                for n, e in enumerate(r.launches):
                    yield f"$.ep[{i}].ranks[{j}].launches[{n}]", e

    def iter_entries(self) -> Iterator[tuple[str, "LaunchEntry | CodeObjectEntry"]]:
        """(JSON-ish path, entry) of every kernel the lock names: every launch, then every code
        object it hands mori whole (``hipcc``, ``jitv2``). What a store must keep, a wheel carry, an
        index hold."""
        yield from self.iter_launches()
        for i, h in enumerate(self.hipcc):
            yield f"$.hipcc[{i}]", h.entry
        for i, j in enumerate(self.jitv2):
            yield f"$.jitv2[{i}]", j.entry

    def kernels(self) -> dict[str, "LaunchEntry | CodeObjectEntry"]:
        """Action key -> entry, for every distinct kernel the lock names (sorted by key)."""
        out: dict[str, Any] = {}
        for _w, e in self.iter_entries():
            out.setdefault(e.key, e)
        return dict(sorted(out.items()))

    def action_keys(self) -> set[str]:
        return {e.key for _w, e in self.iter_entries()}

    def blobs(self) -> dict[str, Digest]:
        """Blob hash -> Digest of every code object the lock names."""
        return {e.blob.hash: e.blob for _w, e in self.iter_entries()}

    def blob_digests(self) -> set[str]:
        return set(self.blobs())

    def check_parts(self) -> "Lock":
        """Check every rank's part now (a lock read from bytes checks a part when it is first
        used). Raises LockFileError naming the first bad one; returns the lock."""
        for t in (*self.tuples, *self.eps):
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
        for ei, ep in enumerate(self.eps):  # a part's launch items index tuples, then ep
            for r in ep.ranks:
                part = parts.setdefault(r.rank, {"rank": r.rank, "kernels": {}, "launches": []})
                seqs = r.launch_keys()
                part["launches"].append([len(self.tuples) + ei, *map(list, seqs)])
                for key in seqs[0]:
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
            "ep": [{"config": ep.config.to_json(), "source": ep.source, "arena": ep.arena.to_json(),
                    "ranks": [r.rank for r in ep.ranks]} for ep in self.eps],
            "hipcc": [h.to_json() for h in self.hipcc],
            "jitv2": [j.to_json() for j in self.jitv2],
            "parts": [parts[r] for r in sorted(parts)],
        }

    def to_bytes(self) -> bytes:
        """The canonical bytes of this lock: the same lock always gives the same bytes (made once
        per lock: the build writes them, signs them and ships them in the wheel)."""
        got = self.__dict__.get("_bytes")
        if got is not None:
            return got
        try:
            data = encode_lock_doc(self.to_json())
        except (TypeError, ValueError) as exc:
            if isinstance(exc, LockFileError):
                raise
            raise LockFileError(f"cannot write the lock: a value is not JSON ({exc})") from None
        object.__setattr__(self, "_bytes", data)  # a cache, not a field: equality and hashing ignore it
        return data

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
            data = decompress_lock(data, where)
        lines = _lines(data)
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


def _lines(data: bytes) -> list:
    """``data.split(b"\\n")``, the head as bytes and every later line as a view of ``data``: a rank
    reads its own part, and the others are never copied."""
    end = data.find(b"\n")
    if end < 0:
        return [data]
    out: list = [data[:end]]
    view = memoryview(data)
    while True:
        start, end = end + 1, data.find(b"\n", end + 1)
        if end < 0:
            out.append(view[start:])
            return out
        out.append(view[start:end])


def compress_lock(lock: "Lock", level: int = 19) -> bytes:
    """``lock``'s canonical bytes in one zstd frame with its content size and checksum: what
    :meth:`Lock.from_bytes` (hence :func:`read_lock`) reads back. Deterministic for a given libzstd."""
    import zstandard

    return zstandard.ZstdCompressor(level=level, write_checksum=True, write_content_size=True).compress(
        lock.to_bytes())


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


def _plain(v: Any) -> Any:
    if isinstance(v, Mapping):
        return {k: _plain(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x) for x in v]
    return v


class _Reader(DocReader):
    """The document reader, and the :class:`Lock` it reads (the one reader's last step)."""

    def hipcc(self, v: Any) -> tuple:
        """The ``hipcc`` items (``model.hipcc``, imported only when a lock has some)."""
        items = self.list(v, "$.hipcc")
        if not items:
            return ()
        from gemmar_aot.model.hipcc import read_lock_hipcc

        return tuple(read_lock_hipcc(self, x, f"$.hipcc[{i}]") for i, x in enumerate(items))

    def jitv2(self, v: Any) -> tuple:
        """The ``jitv2`` items (``model.jitv2_lock``, imported only when a lock has some)."""
        items = self.list(v, "$.jitv2")
        if not items:
            return ()
        from gemmar_aot.model.jitv2_lock import read_lock_jitv2

        return tuple(read_lock_jitv2(self, x, f"$.jitv2[{i}]") for i, x in enumerate(items))

    # ---- the lock ----

    def lock(self, v: Any, lines: list[bytes] | None = None) -> Lock:
        """The lock of head ``v``: with ``lines`` (the file's lines after the head) the parts are
        digests naming them; without, the parts are inline (:meth:`Lock.to_json`'s form)."""
        if type(v) is not dict:
            raise LockFileError(f"{self.where}: a lock file holds a JSON object, this holds {type_name(v)}; "
                                f"{_REBUILD}")
        schema = v.get("schema")
        if type(schema) is not int:
            raise LockFileError(f"{self.where}: $.schema is {show_value(schema)}, not an integer lock schema: it is not a "
                                f"gemmar-aot lock file (this gemmar-aot reads lock schema {LOCK_SCHEMA})")
        if schema > LOCK_SCHEMA:
            raise LockSchemaError(f"{self.where}: lock schema {schema} was written by a newer gemmar-aot; this one "
                                f"reads lock schema {LOCK_SCHEMA}: upgrade gemmar-aot")
        if 1 <= schema < LOCK_SCHEMA and schema not in READ_SCHEMAS:
            raise LockSchemaError(f"{self.where}: lock schema {schema} was written by an older gemmar-aot; this one "
                                f"reads lock schema {LOCK_SCHEMA} and does not convert old locks: rebuild it "
                                f"with `gemmar-aot build MANIFEST` (the store's kernels are reused, nothing is "
                                f"recompiled)")
        if schema not in READ_SCHEMAS:
            raise LockFileError(f"{self.where}: unknown lock schema {schema} (this gemmar-aot reads lock schema "
                                f"{LOCK_SCHEMA}); {_REBUILD}")
        self.obj(v, "$", top_keys(schema))
        m = self.obj(v["manifest"], "$.manifest", ("name", "arch", "sha256"))
        manifest = ManifestRef(self.str(m["name"], "$.manifest.name"), self.str(m["arch"], "$.manifest.arch"),
                               self.hex64(m["sha256"], "$.manifest.sha256"))
        tc = self.obj(v["toolchain"], "$.toolchain", ("digest", "profile", "ingredients"))
        ingr = tc["ingredients"]
        if type(ingr) is not dict:
            raise self.fail("$.toolchain.ingredients", f"is {type_name(ingr)}, expected an object")
        for k, sec in ingr.items():
            if type(sec) is not dict:
                raise self.fail(f"$.toolchain.ingredients.{k}", f"is {type_name(sec)}, expected an object")
            self.json_value(sec, f"$.toolchain.ingredients.{k}")
        toolchain = ToolchainInfo(self.hex64(tc["digest"], "$.toolchain.digest"), ingr,
                                  self.opt_str(tc["profile"], "$.toolchain.profile"))
        env = v["env"]
        if type(env) is not dict:
            raise self.fail("$.env", f"is {type_name(env)}, expected an object")
        for k, x in env.items():
            if x is not None and type(x) is not str:
                raise self.fail(f"$.env.{k}", f"is {type_name(x)} ({show_value(x)}), expected a string or null")
        records = [self.launch_record(r, f"$.launch_records[{i}]")
                   for i, r in enumerate(self.list(v["launch_records"], "$.launch_records"))]
        parts = self.parts(v["parts"], lines, records)
        tuples = tuple(self.tuple(t, f"$.tuples[{i}]", i, parts)
                       for i, t in enumerate(self.list(v["tuples"], "$.tuples")))
        eps = tuple(self.ep(x, f"$.ep[{i}]", len(tuples) + i, parts)
                    for i, x in enumerate(self.list(v["ep"], "$.ep")))
        hipcc = self.hipcc(v["hipcc"]) if "hipcc" in v else ()
        jitv2 = self.jitv2(v["jitv2"]) if "jitv2" in v else ()
        for part in parts.values():
            if not part.tuples:
                raise self.fail(f"$.parts[{part.index}]", f"is rank {part.rank}'s part, but no tuple or EP entry "
                                                          f"lists rank {part.rank}")
        return Lock(manifest=manifest, arch=self.str(v["arch"], "$.arch"),
                    code_object_version=self.int(v["code_object_version"], "$.code_object_version", 1),
                    toolchain=toolchain, env=dict(env), tuples=tuples, eps=eps, hipcc=hipcc, jitv2=jitv2)
