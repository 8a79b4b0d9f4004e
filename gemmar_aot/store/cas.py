"""The store: an action cache over a content-addressed blob store (Bazel's model).

- **Action cache** (``ac/``): key -> record. The key is the caller's sha256 of every
  input of one compile; the record names the output blob by (digest, size) and carries
  the kernel's metadata, launch record and the ``ingredients`` that explain the key,
  all opaque to the store.
- **Blobs** (``blobs/sha256/``): sha256(raw bytes) -> zstd-compressed bytes. Identical
  outputs are stored once. Every load decompresses and checks size and sha256; bad
  bytes raise :class:`CorruptArtifactError`, are moved to ``quarantine/`` and are never
  returned, and every record that points at a missing blob is a miss, so the next build
  recompiles.

Writes publish the blob before the record, each atomically (see ``_fs``), so a reader
never sees a record whose blob is not complete. ``claim(key)`` holds a per-key file
lock so concurrent builders compile each key once.

Runtime-safe: standard library + ``zstandard``; ``filelock`` is imported only by
``claim`` (writers).
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import zstandard

from gemmar_aot.canonical_json import canonical_json_bytes as _canonical_bytes

from . import blobfmt
from ._fs import atomic_write_bytes, check_hex64, fanout, is_hex64, sha256_hex
from .errors import BlobNotFoundError, CorruptArtifactError, StoreError, StoreFormatError

#: Version of the on-disk layout. Bump on any change an older reader would misread.
#: 2: records are zstd-compressed JSON (``ac/ab/<key>.json.zst``); 1 kept them plain.
STORE_FORMAT = 2
FORMAT_FILE = "STORE_FORMAT"
#: Records compress ~3x on their own (spec, metadata, launch record, key ingredients);
#: level 3 keeps a put cheap. Together with the blobs the store is ~15% of the raw
#: code objects for the reference manifest, where plain JSON records made it 42%.
RECORD_SUFFIX = ".json.zst"
RECORD_LEVEL = 3
#: Version of the record envelope (schema/key/blob); the rest of a record is the caller's.
RECORD_SCHEMA = 1
RESERVED_FIELDS = ("schema", "key", "blob")
#: zstd level for new blobs. Level 19 costs ~5 ms per 30 KB GEMM code object (the
#: compile costs 50 ms to 2 s) and decodes as fast as level 3; see bench/bench_store.py.
DEFAULT_LEVEL = 19
#: A record hit refreshes the record's mtime (the LRU clock of ``gc``) at most this often.
TOUCH_INTERVAL_S = 3600.0
DICT_POINTER = "dictionary.json"


def encode_record(rec: Any) -> bytes:
    """A record's bytes on disk: its canonical JSON in one zstd frame (with a checksum)."""
    cctx = zstandard.ZstdCompressor(level=RECORD_LEVEL, write_checksum=True, write_content_size=True)
    return cctx.compress(_canonical_bytes(rec))


class _Bad(Exception):
    """Internal: a file failed a check. Carries the reason."""


class _SizeMismatch(Exception):
    """Internal: a good blob, but not the size the caller (a record or lock) names."""


def read_store_format(root: Path) -> int | None:
    """The store format of ``root``, None when it holds no store. Raises StoreFormatError."""
    p = root / FORMAT_FILE
    try:
        text = p.read_text(encoding="ascii", errors="replace")
    except FileNotFoundError:
        if (root / "ac").is_dir() or (root / "blobs").is_dir():
            raise StoreFormatError(
                f"{root} has store directories but no {FORMAT_FILE} file: it was not written by "
                f"gemmar-aot (or is damaged); use another --store directory") from None
        return None
    except NotADirectoryError:
        raise StoreFormatError(f"{root} is not a directory") from None
    try:
        v = int(text.strip())
    except ValueError:
        raise StoreFormatError(f"{p}: unreadable store format {text.strip()[:40]!r}; "
                               f"this gemmar-aot reads format {STORE_FORMAT}") from None
    if v > STORE_FORMAT:
        raise StoreFormatError(f"{root} is a format-{v} store, written by a newer gemmar-aot; this one "
                               f"reads format {STORE_FORMAT}: upgrade gemmar-aot or use another --store")
    if 0 < v < STORE_FORMAT:
        raise StoreFormatError(f"{root} is a format-{v} store, written by an older gemmar-aot; this one "
                               f"reads format {STORE_FORMAT}: build into a new --store directory (or "
                               f"delete this one; every entry can be rebuilt)")
    if v != STORE_FORMAT:
        raise StoreFormatError(f"{root} has unknown store format {v} (this gemmar-aot reads format "
                               f"{STORE_FORMAT}); use another --store directory")
    return v


class Claim:
    """What ``Store.claim`` yields. ``hit`` is the finished record (someone built it), else None
    and the holder compiles and calls ``put``."""

    def __init__(self, store: "Store", key: str, hit: dict | None):
        self.store = store
        self.key = key
        self.hit = hit
        self.record: dict | None = hit

    def put(self, code: bytes, fields: Mapping[str, Any]) -> dict:
        """Store the compiled bytes and the record fields; returns the record."""
        self.record = self.store.put(self.key, code, fields)
        return self.record


class Store:
    """A store rooted at ``root``. Opening never writes; the first write creates the layout.

    ``level``: zstd level for new blobs. ``touch``: a record hit refreshes its mtime
    (the LRU clock of ``gc``); failures (read-only filesystem) are ignored. ``readonly``:
    never modify anything (no quarantine, no touch, writes raise) -- for reading a store
    that is not ours, e.g. the source of an import. ``durable=False``: no fsyncs (writes
    stay atomic for readers but may be lost on power failure; for tests and scratch stores).
    """

    def __init__(self, root: str | os.PathLike, *, level: int = DEFAULT_LEVEL, touch: bool = True,
                 readonly: bool = False, durable: bool = True):
        self.root = Path(root)
        self.durable = durable
        self.level = level
        self.readonly = readonly
        self.touch = touch and not readonly
        self.format = read_store_format(self.root)
        #: This process's hits, misses, waited_hits (claims), puts, blobs_written, quarantined.
        self.counters: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._ddicts: dict[str, zstandard.ZstdCompressionDict] = {}
        self._cctx: dict[tuple[int, str | None], zstandard.ZstdCompressor] = {}

    def __repr__(self) -> str:
        return f"Store({str(self.root)!r})"

    # ---- layout ----

    @property
    def blob_dir(self) -> Path:
        return self.root / "blobs" / "sha256"

    @property
    def ac_dir(self) -> Path:
        return self.root / "ac"

    @property
    def quarantine_dir(self) -> Path:
        return self.root / "quarantine"

    @property
    def lock_dir(self) -> Path:
        return self.root / "locks"

    @property
    def stats_dir(self) -> Path:
        return self.root / "stats"

    def blob_path(self, digest: str) -> Path:
        return fanout(self.blob_dir, check_hex64(digest, "blob digest"), ".zst")

    def record_path(self, key: str) -> Path:
        return fanout(self.ac_dir, check_hex64(key, "key"), RECORD_SUFFIX)

    def lock_path(self, key: str) -> Path:
        return fanout(self.lock_dir, check_hex64(key, "key"), ".lock")

    def _write(self, path: Path, data: bytes) -> None:
        atomic_write_bytes(path, data, durable=self.durable)

    def exists(self) -> bool:
        return self.format is not None

    def init(self) -> None:
        """Create the layout and the format file (idempotent; every write calls it)."""
        if self.readonly:
            raise StoreError(f"{self.root} was opened read-only")
        if self.format is not None and (self.root / FORMAT_FILE).exists():
            return
        # The format file first: a directory with store subdirectories but no format
        # file is refused by read_store_format.
        if read_store_format(self.root) is None:
            self._write(self.root / FORMAT_FILE, f"{STORE_FORMAT}\n".encode())
        for d in (self.blob_dir, self.ac_dir, self.quarantine_dir, self.lock_dir, self.stats_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.format = STORE_FORMAT

    # ---- blobs ----

    def has_blob(self, digest: str) -> bool:
        return self.blob_path(digest).is_file()

    def load_blob(self, digest: str, size: int | None = None) -> bytes:
        """The verified bytes of blob ``digest``.

        Raises BlobNotFoundError, or CorruptArtifactError (after quarantining the file)
        when the bytes do not decode to ``size`` bytes with sha256 ``digest``.
        """
        p = self.blob_path(digest)
        try:
            data = p.read_bytes()
        except FileNotFoundError:
            raise BlobNotFoundError(digest, p) from None
        try:
            return self._decode(data, digest, size)
        except _Bad as e:
            q = self.quarantine(p, str(e))
            raise CorruptArtifactError.for_blob(p, digest, str(e), q) from None
        except _SizeMismatch as e:
            raise CorruptArtifactError(f"{e} (the record or lock naming it is wrong; the blob at {p} "
                                       f"is intact)", path=p, digest=digest, reason=str(e)) from None

    def _decode(self, data: bytes, digest: str, size: int | None) -> bytes:
        """Decode and verify file bytes; raises _Bad. Never quarantines (callers decide)."""
        try:
            dict_digest, frame = blobfmt.split(data)
            # A fresh decompressor per call: they are not safe to share between threads,
            # and creating one costs ~1 us (the dictionary's digested form is cached).
            dctx = zstandard.ZstdDecompressor(
                dict_data=None if dict_digest is None else self._dictionary(dict_digest))
            raw = blobfmt.decode_frame(frame, dctx, None)
        except blobfmt.BlobFormatError as e:
            raise _Bad(str(e)) from None
        got = sha256_hex(raw)
        if got != digest:
            raise _Bad(f"content sha256 is {got}, expected {digest}")
        if size is not None and len(raw) != size:
            # The blob is what its name says; whoever passed ``size`` is wrong.
            raise _SizeMismatch(f"blob {digest} holds {len(raw)} bytes, the caller expected {size}")
        return raw

    def _dictionary(self, digest: str) -> zstandard.ZstdCompressionDict:
        """A verified dictionary (cached). Raises BlobFormatError when it is unavailable."""
        with self._lock:
            d = self._ddicts.get(digest)
        if d is not None:
            return d
        p = self.blob_path(digest)
        try:
            data = p.read_bytes()
            dict_ref, _ = blobfmt.split(data)
            if dict_ref is not None:
                raise _Bad("a dictionary must not itself need a dictionary")
            raw = self._decode(data, digest, None)
        except FileNotFoundError:
            raise blobfmt.BlobFormatError(f"its zstd dictionary {digest} is not in the store ({p})") from None
        except (_Bad, blobfmt.BlobFormatError) as e:
            self.quarantine(p, f"dictionary: {e}")
            raise blobfmt.BlobFormatError(f"its zstd dictionary {digest} is corrupt ({p}: {e})") from None
        d = zstandard.ZstdCompressionDict(raw)
        with self._lock:
            self._ddicts[digest] = d
        return d

    def _compressor(self, dict_digest: str | None) -> zstandard.ZstdCompressor:
        k = (self.level, dict_digest)
        with self._lock:
            c = self._cctx.get(k)
        if c is None:
            c = blobfmt.compressor(self.level, self._dictionary(dict_digest) if dict_digest else None)
            with self._lock:
                self._cctx[k] = c
        return c

    def encode_blob(self, raw: bytes, digest: str, dict_digest: str | None) -> bytes:
        """File bytes for ``raw``, checked to decode back to it before they are returned."""
        data = blobfmt.encode(raw, self._compressor(dict_digest), dict_digest)
        try:
            self._decode(data, digest, len(raw))
        except (_Bad, _SizeMismatch) as e:  # pragma: no cover - a zstd or memory fault
            raise StoreError(f"zstd round trip of blob {digest} failed ({e}); not stored") from None
        return data

    def put_blob(self, data: bytes, *, use_dictionary: bool = True) -> dict:
        """Store ``data`` (once per content); returns ``{"digest", "size"}``."""
        data = bytes(data)
        digest = sha256_hex(data)
        p = self.blob_path(digest)
        if p.is_file():
            try:
                self._decode(p.read_bytes(), digest, None)
                return {"digest": digest, "size": len(data)}
            except FileNotFoundError:
                pass  # removed under us (gc): write it again
            except _Bad as e:
                self.quarantine(p, f"found corrupt while storing it again: {e}")
        self.init()
        dd = self.current_dictionary() if use_dictionary else None
        self._write(p, self.encode_blob(data, digest, dd))
        self.counters["blobs_written"] += 1
        return {"digest": digest, "size": len(data)}

    # ---- records ----

    def _parse_record(self, data: bytes, key: str) -> dict:
        """Decode a record and check its envelope; raises _Bad."""
        try:
            data = zstandard.ZstdDecompressor().decompress(data)
        except zstandard.ZstdError as e:
            raise _Bad(f"not a zstd frame: {e}") from None
        try:
            rec = json.loads(data)
        except (ValueError, UnicodeDecodeError) as e:
            raise _Bad(f"not JSON: {e}") from None
        if not isinstance(rec, dict):
            raise _Bad("not a JSON object")
        if rec.get("schema") != RECORD_SCHEMA:
            raise _Bad(f"record schema {rec.get('schema')!r}, expected {RECORD_SCHEMA}")
        if rec.get("key") != key:
            raise _Bad(f"record is for key {rec.get('key')!r}, stored under {key}")
        b = rec.get("blob")
        if not (isinstance(b, dict) and is_hex64(b.get("digest")) and isinstance(b.get("size"), int)
                and not isinstance(b.get("size"), bool) and b["size"] >= 0):
            raise _Bad(f"record has no valid blob reference: {b!r}")
        return rec

    def read_record_file(self, key: str) -> dict | None:
        """The record stored under ``key``, envelope-checked; None when absent.

        An unreadable record is quarantined and reads as None. Does not check the blob.
        """
        p = self.record_path(key)
        try:
            data = p.read_bytes()
        except FileNotFoundError:
            return None
        try:
            return self._parse_record(data, key)
        except _Bad as e:
            self.quarantine(p, f"unreadable record: {e}")
            return None

    def get_record(self, key: str, *, verify: bool = False) -> dict | None:
        """The record for ``key``, or None (a miss).

        A record is a hit only if its blob is present; with ``verify`` the blob is also
        decoded and checked (a corrupt one is quarantined and the record is a miss).
        """
        rec = self.read_record_file(key)
        if rec is None:
            return None
        digest, size = rec["blob"]["digest"], rec["blob"]["size"]
        if verify:
            try:
                self.load_blob(digest, size)
            except (BlobNotFoundError, CorruptArtifactError):
                return None
        elif not self.blob_path(digest).is_file():
            return None
        if self.touch:
            self._touch(self.record_path(key))
        return rec

    def _touch(self, p: Path) -> None:
        with contextlib.suppress(OSError):
            if time.time() - p.stat().st_mtime > TOUCH_INTERVAL_S:
                os.utime(p)

    def load(self, key: str) -> tuple[dict, bytes] | None:
        """(record, verified code bytes) for ``key``, or None when it is a miss."""
        rec = self.get_record(key)
        if rec is None:
            return None
        try:
            return rec, self.load_blob(rec["blob"]["digest"], rec["blob"]["size"])
        except (BlobNotFoundError, CorruptArtifactError):
            return None

    def put(self, key: str, code: bytes, fields: Mapping[str, Any]) -> dict:
        """Store ``code`` and the record ``fields`` under ``key`` (blob first, then record).

        ``fields`` is any JSON-able mapping (metadata, launch, ingredients, ...) without the
        reserved names ``schema``, ``key``, ``blob``. Use ``claim`` to avoid duplicate compiles.
        """
        check_hex64(key, "key")
        bad = [f for f in RESERVED_FIELDS if f in fields]
        if bad:
            raise ValueError(f"record fields {bad} are reserved by the store")
        rec = {**fields, "schema": RECORD_SCHEMA, "key": key}
        try:
            _canonical_bytes(rec)
        except (TypeError, ValueError) as e:
            raise ValueError(f"record fields for {key} are not JSON-able: {e}") from None
        rec["blob"] = self.put_blob(code)
        self._write(self.record_path(key), encode_record(rec))
        self.counters["puts"] += 1
        return rec

    @contextlib.contextmanager
    def claim(self, key: str, *, timeout: float | None = None) -> Iterator[Claim]:
        """Claim ``key`` for compiling. Inside the block, ``claim.hit`` is the record when it is
        (or, after waiting for another builder's lock, became) available; otherwise compile and
        ``claim.put(code, fields)``. The per-key lock is held for the whole block.
        """
        check_hex64(key, "key")
        rec = self.get_record(key, verify=True)
        if rec is not None:
            self.counters["hits"] += 1
            yield Claim(self, key, rec)
            return
        self.init()
        from filelock import FileLock, Timeout

        lp = self.lock_path(key)
        lp.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(lp), timeout=-1 if timeout is None else timeout)
        try:
            lock.acquire()
        except Timeout:
            raise StoreError(f"timed out after {timeout} s waiting for the lock {lp}: another "
                             f"builder is compiling this key") from None
        try:
            rec = self.get_record(key, verify=True)
            self.counters["hits" if rec is not None else "misses"] += 1
            if rec is not None:
                self.counters["waited_hits"] += 1
            yield Claim(self, key, rec)
        finally:
            lock.release()

    # ---- dictionary ----

    def dictionary_info(self) -> dict | None:
        """The dictionary new blobs are compressed with: ``{"digest", "bytes", "trained_on", "level"}``."""
        p = self.root / DICT_POINTER
        try:
            info = json.loads(p.read_bytes())
        except FileNotFoundError:
            return None
        except ValueError:
            self.quarantine(p, "unreadable dictionary pointer")
            return None
        if not isinstance(info, dict) or not is_hex64(info.get("digest")):
            self.quarantine(p, "malformed dictionary pointer")
            return None
        return info

    def current_dictionary(self) -> str | None:
        """Digest of the dictionary for new blobs, None for plain zstd (also when it is unusable)."""
        info = self.dictionary_info()
        if info is None:
            return None
        try:
            self._dictionary(info["digest"])
        except blobfmt.BlobFormatError:
            return None
        return info["digest"]

    def set_dictionary(self, raw: bytes | None, *, trained_on: int = 0) -> str | None:
        """Store ``raw`` (a zstd dictionary) as a blob and use it for new blobs; None: plain zstd."""
        self.init()
        p = self.root / DICT_POINTER
        if raw is None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)
            return None
        if raw[:4] != blobfmt.ZSTD_DICT_MAGIC:
            raise ValueError("not a zstd dictionary (bad magic)")
        ref = self.put_blob(raw, use_dictionary=False)
        self._write(p, _canonical_bytes({"digest": ref["digest"], "bytes": ref["size"],
                                                "trained_on": trained_on, "level": self.level}))
        return ref["digest"]

    def quarantine(self, path: Path, reason: str) -> Path | None:
        """Move ``path`` to ``quarantine/`` with a ``.reason`` note. None if it could not be moved."""
        path = Path(path)
        with self._lock:  # decoders cached for a quarantined dictionary must go
            self._ddicts.pop(path.name[:-4], None)
            self._cctx = {k: v for k, v in self._cctx.items() if k[1] != path.name[:-4]}
        if self.readonly:
            return None
        try:
            rel = path.relative_to(self.root)
        except ValueError:
            return None  # never move files of another directory
        try:
            self.quarantine_dir.mkdir(parents=True, exist_ok=True)
            stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime())
            kind = rel.parts[0] if len(rel.parts) > 1 else "root"
            dest = self.quarantine_dir / (f"{stamp}-{os.getpid()}-{time.monotonic_ns() % 10**9:09d}-"
                                          f"{kind}-{path.name}")
            os.replace(path, dest)
        except OSError:
            return None
        with contextlib.suppress(OSError):
            (dest.parent / (dest.name + ".reason")).write_text(f"{path}\n{reason}\n")
        self.counters["quarantined"] += 1
        return dest

    # ---- build stats ----

    def record_build_stats(self, stats: Mapping[str, Any]) -> Path:
        """Write the last build's numbers (hits, misses, ...) to ``stats/last-build.json``."""
        self.init()
        p = self.stats_dir / "last-build.json"
        self._write(p, _canonical_bytes(dict(stats)))
        return p

    def last_build_stats(self) -> dict | None:
        try:
            d = json.loads((self.stats_dir / "last-build.json").read_bytes())
        except (OSError, ValueError):
            return None
        return d if isinstance(d, dict) else None

    # ---- maintenance (implemented in maint.py) ----

    def ls(self, filter=None) -> list[dict]:  # noqa: A002 - the CLI's word
        from .maint import ls
        return ls(self, filter)

    def stats(self) -> dict:
        from .maint import stats
        return stats(self)

    def verify(self) -> list[dict]:
        from .maint import verify
        return verify(self)

    def gc(self, keep_blobs=frozenset(), keep_keys=None, max_bytes=None, max_age_days=None, **kw) -> dict:
        from .maint import gc
        return gc(self, keep_blobs, keep_keys, max_bytes, max_age_days, **kw)

    def export(self, lock: Mapping[str, Any], dest_dir) -> dict:
        from .maint import export
        return export(self, lock, dest_dir)

    def import_(self, src_dir) -> dict:
        from .maint import import_
        return import_(self, src_dir)

    def train_dictionary(self, **kw) -> str | None:
        from .maint import train_dictionary
        return train_dictionary(self, **kw)

    def repack(self, **kw) -> dict:
        from .maint import repack
        return repack(self, **kw)

    def optimize(self, **kw) -> dict:
        from .maint import optimize
        return optimize(self, **kw)
