"""The store: an action cache over a content-addressed blob store (Bazel's model).

- **Action cache**: key -> record. The key is the caller's sha256 of every input of one
  compile; the record names the output blob by (digest, size) and carries the kernel's
  metadata, launch record and the ``ingredients`` that explain the key, all opaque here.
- **Blobs**: sha256(raw bytes) -> bytes. Identical outputs are stored once. Every load
  decodes and checks size and sha256 (:mod:`.blob_codec`); bad bytes raise
  :class:`CorruptArtifactError`, are quarantined and never returned, and a record whose
  blob is missing is a miss, so the next build recompiles.

:class:`Store` is the front every reader and writer uses (the build, ``wheel``, the
runtime's loader, ``verify``, ``export``/``import``). It layers backends
(:mod:`.backend`): the local directory (:class:`~.local.DirectoryBackend`, or the
read-only :class:`~.pack.PackBackend` of an installed wheel) in front of an optional
``remote``. Writes publish the blob before the record, each atomically, so a reader never
sees a record whose blob is not complete. ``claim(key)`` holds a per-key file lock
(``claims/``) so concurrent builders compile each key once.

Runtime-safe: standard library + ``zstandard``; ``filelock`` is imported only by
``claim`` (writers).
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from gemmar_aot.util.canonical_json import canonical_json_bytes as canonical_json

from .backend import RECORD_SCHEMA, RESERVED_FIELDS, CacheBackend, Digest, record_blob, record_launcher
from .blob_codec import BadBlob, SizeMismatch, check_content
from .store_errors import BlobNotFoundError, CorruptArtifactError, StoreError
from .local import (
    DEFAULT_LEVEL,
    FORMAT_FILE,
    STORE_FORMAT,
    DirectoryBackend,
    read_store_format,
)
from .pack import PACK_FILE, PackBackend

__all__ = ["DEFAULT_LEVEL", "FORMAT_FILE", "RECORD_SCHEMA", "STORE_FORMAT", "Claim", "Store",
           "read_store_format"]


class Claim:
    """What ``Store.claim`` yields. ``hit`` is the finished record (someone built it), else None
    and the holder compiles and calls ``put``."""

    def __init__(self, store: "Store", key: str, hit: dict | None):
        self.store = store
        self.key = key
        self.hit = hit
        self.record: dict | None = hit

    def put(self, code: bytes, fields: Mapping[str, Any], *, launcher: bytes | None = None) -> dict:
        """Store the compiled bytes (and launcher) and the record fields; returns the record."""
        self.record = self.store.put(self.key, code, fields, launcher=launcher)
        return self.record


class Store:
    """A store rooted at ``root``, optionally in front of a ``remote`` backend.

    ``level``: zstd level for new blobs. ``touch``: a record hit refreshes its mtime
    (the LRU clock of ``gc``). ``readonly``: never modify anything (no quarantine, no
    touch, writes raise) -- e.g. the source of an import, an installed wheel.
    ``durable=False``: no fsyncs (tests and scratch stores). ``remote``: another
    :class:`~.backend.CacheBackend` read through and written through (see :mod:`.backend`).
    A root holding a pack file (an artifact wheel's store) opens read-only as a pack.
    """

    def __init__(self, root: str | os.PathLike, *, level: int = DEFAULT_LEVEL, touch: bool = True,
                 readonly: bool = False, durable: bool = True, remote: CacheBackend | None = None):
        self.root = Path(root)
        if (self.root / PACK_FILE).is_file():
            self.local: DirectoryBackend | PackBackend = PackBackend(self.root)
            readonly = True
        else:
            self.local = DirectoryBackend(self.root, level=level, touch=touch, readonly=readonly,
                                          durable=durable)
        self.readonly = readonly
        self.remote = remote
        #: This process's hits, misses, waited_hits (claims), puts, remote_hits, remote_errors.
        self.counters: Counter[str] = Counter()
        #: One line per remote failure (the caller decides how loudly to report them).
        self.remote_problems: list[str] = []

    def __repr__(self) -> str:
        return f"Store({str(self.root)!r})"

    # ---- layout (the local backend's) ----

    @property
    def format(self) -> int | None:
        return self.local.format

    @property
    def level(self) -> int:
        return self.local.level

    @level.setter
    def level(self, v: int) -> None:
        self.local.level = v

    @property
    def durable(self) -> bool:
        return getattr(self.local, "durable", False)

    @property
    def blob_dir(self) -> Path:
        return self.local.blob_dir

    @property
    def ac_dir(self) -> Path:
        return self.local.ac_dir

    @property
    def quarantine_dir(self) -> Path:
        return self.local.quarantine_dir

    @property
    def lock_dir(self) -> Path:
        """``locks/``: the build's lock files only."""
        return self.local.lock_dir

    @property
    def claim_dir(self) -> Path:
        return self.local.claim_dir

    @property
    def stats_dir(self) -> Path:
        return self.local.stats_dir

    @property
    def work_dir(self) -> Path:
        """``work/``: scratch directories of compiles in flight (see the directory backend)."""
        return self.local.work_dir

    def blob_path(self, digest: str) -> Path:
        return self.local.blob_path(digest)

    def record_path(self, key: str) -> Path:
        return self.local.record_path(key)

    def claim_path(self, key: str) -> Path:
        return self.local.claim_path(key)

    def describe_blob(self, digest: str) -> str:
        """Where blob ``digest`` is read from, for messages."""
        return self.local.describe_blob(digest) if isinstance(self.local, PackBackend) else str(self.blob_path(digest))

    def exists(self) -> bool:
        return self.local.format is not None

    def init(self) -> None:
        """Create (or migrate) the local layout; idempotent, every write calls it."""
        self.local.init()

    @property
    def counters_all(self) -> Counter[str]:
        """This process's counters, the local backend's included (quarantined, ...)."""
        return self.counters + self.local.counters

    # ---- blobs ----

    def has_blob(self, digest: str) -> bool:
        return self.local.contains_blob(digest)

    def load_blob(self, digest: str, size: int | None = None) -> bytes:
        """The verified bytes of blob ``digest`` (and ``size`` when given).

        Raises BlobNotFoundError, or CorruptArtifactError (after quarantining the file)
        when the bytes do not decode to ``size`` bytes with sha256 ``digest``. With a
        remote, a blob missing locally is fetched, verified and kept.
        """
        try:
            return self.local.load_blob(digest, size)
        except BlobNotFoundError:
            if self.remote is None or size is None:
                raise
            raw = self._remote_blob(Digest(digest, size))
            if raw is None:
                raise
            return raw

    def put_blob(self, data: bytes, *, use_dictionary: bool = True) -> Digest:
        """Store ``data`` (once per content); returns its Digest."""
        return self.local.put_blob(data, use_dictionary=use_dictionary)

    # ---- records ----

    def read_record_file(self, key: str) -> dict | None:
        """The local record stored under ``key``, envelope-checked; None when absent or unreadable
        (unreadable ones are quarantined). Does not check the blob."""
        return self.local.get_record(key)

    def read_record_named(self, key: str, want: Digest) -> dict | None:
        """The local record under ``key`` (without its timings) when it is the one the digest
        ``want`` names (a lock's record digest, ``store.record.record_digest``); None otherwise --
        then :meth:`read_record_file` and ``record_digest`` say what is there."""
        return self.local.get_record_named(key, want)

    def get_record(self, key: str, *, verify: bool = False) -> dict | None:
        """The record for ``key``, or None (a miss).

        A record is a hit only if its blob is present; with ``verify`` the blob is also
        decoded and checked (a corrupt one is quarantined and the record is a miss).
        Local first; then the remote, whose hit is verified and copied into the local store.
        """
        rec = self.local.get_record(key)
        if rec is not None:
            d = record_blob(rec)
            if verify:
                try:
                    self.local.load_blob(d.hash, d.size)
                    return rec
                except (BlobNotFoundError, CorruptArtifactError):
                    pass
            elif self.local.contains_blob(d.hash):
                return rec
        if self.remote is None:
            return None
        return self._remote_record(key)

    def load(self, key: str) -> tuple[dict, bytes] | None:
        """(record, verified code bytes) for ``key``, or None when it is a miss."""
        rec = self.get_record(key)
        if rec is None:
            return None
        try:
            d = record_blob(rec)
            return rec, self.load_blob(d.hash, d.size)
        except (BlobNotFoundError, CorruptArtifactError):
            return None

    def put(self, key: str, code: bytes, fields: Mapping[str, Any], *, launcher: bytes | None = None) -> dict:
        """Store ``code`` and the record ``fields`` under ``key`` (blobs first, then record).

        ``fields`` is any JSON-able mapping (metadata, launch, ingredients, ...) without the
        reserved names ``schema``, ``key``, ``blob``, ``launcher``. ``launcher``: the compile's
        second output (``compiler.launcher.Launcher`` bytes), stored as a blob the record names,
        so the record can be derived again without a compile. Use ``claim`` to avoid duplicate
        compiles. With a writable remote, the same blobs-then-record goes there too.
        """
        self.local.record_path(key)  # validates the key
        bad = [f for f in RESERVED_FIELDS if f in fields]
        if bad:
            raise ValueError(f"record fields {bad} are reserved by the store")
        rec = {**fields, "schema": RECORD_SCHEMA, "key": key}
        try:
            canonical_json(rec)
        except (TypeError, ValueError) as e:
            raise ValueError(f"record fields for {key} are not JSON-able: {e}") from None
        if launcher is not None:
            rec["launcher"] = self.local.put_blob(launcher).to_json()
        rec["blob"] = self.local.put_blob(code).to_json()
        self.local.put_record(key, rec)
        self.counters["puts"] += 1
        self._upload(key, rec, code, launcher)
        return rec

    def put_record(self, key: str, rec: Mapping[str, Any]) -> None:
        """Replace the local record under ``key`` with ``rec`` (a whole record whose blobs are
        already stored): how a re-derived record is written back. Never uploads."""
        self.local.put_record(key, rec)

    # ---- remote layering ----

    def _remote_failed(self, what: str, exc: BaseException) -> None:
        self.counters["remote_errors"] += 1
        line = f"remote cache {self.remote.name}: {what} failed: {exc}"
        if not self.remote_problems:
            print(f"warning: {line}; going on with the local store", file=sys.stderr)
        self.remote_problems.append(line)

    def _remote_blob(self, d: Digest) -> bytes | None:
        """Verified bytes of ``d`` from the remote (kept locally), None when it has none."""
        try:
            raw = self.remote.get_blob(d)
        except CorruptArtifactError as e:
            self.counters["remote_corrupt"] += 1
            self._remote_failed(f"blob {d.hash}", e)
            return None
        except Exception as e:  # noqa: BLE001 - a remote failure is a miss, never fatal here
            self._remote_failed(f"blob {d.hash}", e)
            return None
        if raw is None:
            return None
        try:
            check_content(raw, d.hash, d.size)  # never trust a backend further than this
        except (BadBlob, SizeMismatch) as e:
            self.counters["remote_corrupt"] += 1
            self._remote_failed(f"blob {d.hash}", e)
            return None
        if not self.readonly:
            self.local.put_blob(raw)
        return raw

    def _remote_record(self, key: str) -> dict | None:
        try:
            rec = self.remote.get_record(key)
        except Exception as e:  # noqa: BLE001
            self._remote_failed(f"record {key}", e)
            return None
        if rec is None:
            return None
        raw = self._remote_blob(record_blob(rec))
        if raw is None:
            self.counters["remote_record_without_blob"] += 1
            return None  # a record whose blob is missing is a miss
        ln = record_launcher(rec)
        if ln is not None and not self.local.contains_blob(ln.hash) and self._remote_blob(ln) is None:
            self.counters["remote_record_without_launcher"] += 1  # a hit, degraded: cannot re-derive offline
        if not self.readonly:
            self.local.put_record(key, rec)
        self.counters["remote_hits"] += 1
        return rec

    def _upload(self, key: str, rec: Mapping[str, Any], code: bytes, launcher: bytes | None = None) -> None:
        if self.remote is None or not self.remote.writable:
            return
        try:
            if launcher is not None:
                self.remote.put_blob(launcher)
            self.remote.put_blob(code)  # blobs before record
            self.remote.put_record(key, rec)
            self.counters["uploads"] += 1
        except Exception as e:  # noqa: BLE001
            self._remote_failed(f"upload of {key}", e)

    # ---- claims ----

    @contextlib.contextmanager
    def claim(self, key: str, *, timeout: float | None = None) -> Iterator[Claim]:
        """Claim ``key`` for compiling. Inside the block, ``claim.hit`` is the record when it is
        (or, after waiting for another builder's claim, became) available; otherwise compile and
        ``claim.put(code, fields)``. The per-key claim (a file lock in ``claims/``) is held for
        the whole block.
        """
        cp = self.claim_path(key)
        rec = self.get_record(key, verify=True)
        if rec is not None:
            self.counters["hits"] += 1
            yield Claim(self, key, rec)
            return
        self.init()
        from filelock import FileLock, Timeout

        cp.parent.mkdir(parents=True, exist_ok=True)
        lock = FileLock(str(cp), timeout=-1 if timeout is None else timeout)
        try:
            lock.acquire()
        except Timeout:
            raise StoreError(f"timed out after {timeout} s waiting for the claim {cp}: another "
                             f"builder is compiling this key") from None
        try:
            rec = self.get_record(key, verify=True)
            self.counters["hits" if rec is not None else "misses"] += 1
            if rec is not None:
                self.counters["waited_hits"] += 1
            yield Claim(self, key, rec)
        finally:
            lock.release()

    # ---- dictionaries ----

    def dictionary_info(self, kind: str = "blobs") -> dict | None:
        """The dictionary new ``kind`` ("blobs" or "records") use: ``{"hash", "size", "trained_on", "level"}``."""
        return self.local.dictionary_info(kind)

    def current_dictionary(self, kind: str = "blobs") -> str | None:
        """Digest of the dictionary for new ``kind``, None for plain zstd (also when it is unusable)."""
        return self.local.current_dictionary(kind)

    def set_dictionary(self, raw: bytes | None, *, trained_on: int = 0, kind: str = "blobs") -> str | None:
        """Store ``raw`` (a zstd dictionary, with a spare copy) and use it for new ``kind``."""
        return self.local.set_dictionary(raw, kind=kind, trained_on=trained_on)

    def quarantine(self, path: Path, reason: str) -> Path | None:
        """Move ``path`` to ``quarantine/`` with a ``.reason`` note. None if it could not be moved."""
        return self.local.quarantine(path, reason)

    # ---- build stats ----

    def record_build_stats(self, stats: Mapping[str, Any]) -> Path:
        """Write the last build's numbers (hits, misses, ...) to ``stats/last-build.json``."""
        self.init()
        p = self.stats_dir / "last-build.json"
        self.local.write_file(p, canonical_json(dict(stats)))
        return p

    def last_build_stats(self) -> dict | None:
        try:
            d = json.loads((self.stats_dir / "last-build.json").read_bytes())
        except (OSError, ValueError):
            return None
        return d if isinstance(d, dict) else None
