"""The local store directory as a :class:`~gemmar_aot.store.backend.CacheBackend`.

Layout under the root (``STORE_FORMAT`` 4)::

    STORE_FORMAT                       "4\\n"; another format is refused (2 and 3 are migrated on first write)
    blobs/sha256/ab/<digest>.zst       a blob file (:mod:`.blobfmt`): zstd of the bytes whose sha256 is <digest>
    ac/ab/<key>.json.zst               a record: canonical JSON in a blob-format zstd frame, usually
                                       compressed with the record dictionary
    dictionaries/<digest>.zst          the spare copy of every zstd dictionary (a dictionary is also
                                       an ordinary blob in blobs/); a damaged copy is restored from the other
    dictionary.json                    the dictionary new blobs use (optional)
    record-dictionary.json             the dictionary new records use (optional)
    claims/ab/<key>.claim              per-key build claims (file locks; see ``Store.claim``)
    locks/<manifest>.lock.json         lock files (written by the build; the store never touches them)
    quarantine/                        files that failed verification, with a ``.reason`` note
    stats/last-build.json              the last build's numbers

Every file is published atomically (``_fs.atomic_write_bytes``). Decoding goes through
:class:`~gemmar_aot.store.blob_codec.BlobCodec`, the one decode-and-verify path.

Runtime-safe: standard library + ``zstandard``.
"""

from __future__ import annotations

import contextlib
import json
import os
import threading
import time
from collections import Counter
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any

from gemmar_aot.store.record import RECORD_VOLATILE_FIELDS, record_digest
from gemmar_aot.util.atomic_write import atomic_write_bytes
from gemmar_aot.util.canonical_json import canonical_json_bytes as canonical_json

from gemmar_aot.util.filedigest import is_hex64, sha256_hex

from ._fs import check_hex64, fanout, iter_fanned
from .backend import BadRecord, CacheBackend, Digest, check_record, read_record
from .blob_codec import BadBlob, BlobCodec, DictionaryUnavailable, SizeMismatch
from .store_errors import BlobNotFoundError, CorruptArtifactError, StoreError, StoreFormatError
from .local_dictionaries import DICT_POINTERS, RECORD_LEVEL, DictionaryFiles

#: Version of the on-disk layout. Bump on any change an older reader would misread.
#: 2: records are zstd-compressed JSON (``ac/ab/<key>.json.zst``); 1 kept them plain.
#: 3: records may name a zstd dictionary (blob format); per-key build claims live in
#:    ``claims/`` (format 2 kept them in ``locks/ab/<key>.lock``); dictionaries have a
#:    spare copy in ``dictionaries/``. A format-2 store is migrated on its first write.
#: 4: one digest spelling, ``{"hash", "size"}``: records of record schema 2 only
#:    (``backend.RECORD_SCHEMA``), and the dictionary pointers name their dictionary so. A
#:    format-3 store is migrated on its first write (``migrate``); an older gemmar-aot, which
#:    would take schema-2 records for damage, refuses a format-4 store instead.
STORE_FORMAT = 4
FORMAT_FILE = "STORE_FORMAT"
#: Formats :func:`migrate` upgrades in place.
MIGRATABLE = (2, 3)
RECORD_SUFFIX = ".json.zst"
BLOB_SUFFIX = ".zst"
CLAIM_SUFFIX = ".claim"
#: zstd level for new blobs. Level 19 costs little next to a compile and decodes as fast as
#: level 3; see bench/bench_store.py and BENCHMARKS.md.
DEFAULT_LEVEL = 19
#: A record hit refreshes the record's mtime (the LRU clock of ``gc``) at most this often.
TOUCH_INTERVAL_S = 3600.0


def read_store_format(root: Path) -> int | None:
    """The store format of ``root``, None when it holds no store. Raises StoreFormatError.

    A format in :data:`MIGRATABLE` is returned as is (readable; upgraded by the first write).
    """
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
    if v in MIGRATABLE:
        return v
    if 0 < v < STORE_FORMAT:
        raise StoreFormatError(f"{root} is a format-{v} store, written by an older gemmar-aot; this one "
                               f"reads format {STORE_FORMAT}: build into a new --store directory (or "
                               f"delete this one; every entry can be rebuilt)")
    if v != STORE_FORMAT:
        raise StoreFormatError(f"{root} has unknown store format {v} (this gemmar-aot reads format "
                               f"{STORE_FORMAT}); use another --store directory")
    return v


class DirectoryBackend(DictionaryFiles, CacheBackend):
    """A store directory. Opening never writes; the first write creates (or migrates) the layout.

    ``readonly``: never modify anything (no quarantine, no touch, no restore; writes raise).
    ``durable=False``: no fsyncs (atomic for readers, not crash-durable; tests, scratch).
    ``touch``: a record hit refreshes its mtime (``gc``'s LRU clock).
    """

    name = "local"

    def __init__(self, root: str | os.PathLike, *, level: int = DEFAULT_LEVEL, touch: bool = True,
                 readonly: bool = False, durable: bool = True):
        self.root = Path(root)
        self.readonly = readonly
        self.writable = not readonly
        self.durable = durable
        self.touch = touch and not readonly
        self.format = read_store_format(self.root)
        self.codec = BlobCodec(self._load_dictionary, level=level)
        #: quarantined, dictionaries_restored, blobs_written, records_written.
        self.counters: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._init_lock = threading.Lock()  # the first writes into a new store may come from many threads
        self._blob_dir_str = os.path.join(str(self.root), "blobs", "sha256")

    def __repr__(self) -> str:
        return f"DirectoryBackend({str(self.root)!r})"

    @property
    def level(self) -> int:
        return self.codec.level

    @level.setter
    def level(self, v: int) -> None:
        self.codec.level = v

    # ---- layout ----

    @property
    def blob_dir(self) -> Path:
        return self.root / "blobs" / "sha256"

    @property
    def ac_dir(self) -> Path:
        return self.root / "ac"

    @property
    def spare_dir(self) -> Path:
        return self.root / "dictionaries"

    @property
    def claim_dir(self) -> Path:
        return self.root / "claims"

    @property
    def quarantine_dir(self) -> Path:
        return self.root / "quarantine"

    @property
    def lock_dir(self) -> Path:
        """``locks/``: the build's lock files (``<manifest>.lock.json``) and nothing else."""
        return self.root / "locks"

    @property
    def stats_dir(self) -> Path:
        return self.root / "stats"

    @property
    def work_dir(self) -> Path:
        """``work/``: a directory per compile in flight (its staging and output); the compile
        removes its own, ``gc`` the ones a killed build left."""
        return self.root / "work"

    def blob_path(self, digest: str) -> Path:
        return fanout(self.blob_dir, check_hex64(digest, "blob digest"), BLOB_SUFFIX)

    def spare_path(self, digest: str) -> Path:
        return self.spare_dir / f"{check_hex64(digest, 'dictionary digest')}{BLOB_SUFFIX}"

    def record_path(self, key: str) -> Path:
        return fanout(self.ac_dir, check_hex64(key, "key"), RECORD_SUFFIX)

    def claim_path(self, key: str) -> Path:
        return fanout(self.claim_dir, check_hex64(key, "key"), CLAIM_SUFFIX)

    def write_file(self, path: Path, data: bytes) -> None:
        """Publish ``data`` at ``path`` (inside the store) atomically."""
        if self.readonly:
            raise StoreError(f"{self.root} was opened read-only")
        atomic_write_bytes(path, data, durable=self.durable)

    def awaits_migration(self) -> bool:
        """Whether this store is of an older format its first write migrates (``MIGRATABLE``)."""
        return self.format in MIGRATABLE

    def exists(self) -> bool:
        return self.format is not None

    def init(self) -> None:
        """Create the layout and the format file, or migrate an older format (idempotent)."""
        if self.readonly:
            raise StoreError(f"{self.root} was opened read-only")
        if self.format == STORE_FORMAT and (self.root / FORMAT_FILE).exists():
            return
        with self._init_lock:
            # One thread at a time: first writers racing through here refused each other's
            # half-made layout as "not written by gemmar-aot" (tests/test_store_threads.py).
            if self.format == STORE_FORMAT and (self.root / FORMAT_FILE).exists():
                return
            self._init_layout()

    def _init_layout(self) -> None:
        fmt = read_store_format(self.root)
        if fmt is not None and fmt != STORE_FORMAT:
            from .migrate import migrate  # a store of an older format, once

            migrate(self, fmt, to=STORE_FORMAT, format_file=FORMAT_FILE, dictionary_pointers=DICT_POINTERS)
        # The format file first: a directory with store subdirectories but no format
        # file is refused by read_store_format.
        if fmt is None:
            self.write_file(self.root / FORMAT_FILE, f"{STORE_FORMAT}\n".encode())
        for d in (self.blob_dir, self.ac_dir, self.quarantine_dir, self.lock_dir, self.stats_dir):
            d.mkdir(parents=True, exist_ok=True)
        self.format = STORE_FORMAT

    # ---- listing (maintenance reads these) ----

    def iter_blob_files(self) -> Iterator[tuple[str, Path]]:
        """(digest, path) of every published blob file, sorted."""
        for digest, p in iter_fanned(self.blob_dir, BLOB_SUFFIX):
            if is_hex64(digest) and p.parent.name == digest[:2]:
                yield digest, p

    def iter_record_files(self) -> Iterator[tuple[str, Path]]:
        """(key, path) of every published record file, sorted."""
        for key, p in iter_fanned(self.ac_dir, RECORD_SUFFIX):
            if is_hex64(key) and p.parent.name == key[:2]:
                yield key, p

    # ---- blobs ----

    def contains_blob(self, digest: Digest | str) -> bool:
        return self.blob_path(digest.hash if isinstance(digest, Digest) else digest).is_file()

    def decode_file(self, path: Path, digest: str, size: int | None = None) -> bytes:
        """Verified content of the blob file at ``path``; a bad file is quarantined.

        Raises BlobNotFoundError or CorruptArtifactError.
        """
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise BlobNotFoundError(digest, path) from None
        try:
            return self.codec.decode(data, digest, size)
        except DictionaryUnavailable as e:
            # The blob may be fine; its dictionary is gone. It is unusable either way.
            q = self.quarantine(path, str(e))
            raise CorruptArtifactError.for_blob(path, digest, str(e), q) from None
        except BadBlob as e:
            q = self.quarantine(path, str(e))
            raise CorruptArtifactError.for_blob(path, digest, str(e), q) from None
        except SizeMismatch as e:
            raise CorruptArtifactError(f"{e} (the record or lock naming it is wrong; the blob at {path} "
                                       f"is intact)", path=path, digest=digest, reason=str(e)) from None

    def load_blob(self, digest: str, size: int | None = None) -> bytes:
        """The verified bytes of blob ``digest``. Raises BlobNotFoundError or CorruptArtifactError.

        The hot path of a runtime's startup (one call per code object): the file is opened by a
        string path; a :class:`~pathlib.Path` is made only for an error."""
        check_hex64(digest, "blob digest")
        try:
            with open(f"{self._blob_dir_str}/{digest[:2]}/{digest}{BLOB_SUFFIX}", "rb") as f:
                data = f.read()
            return self.codec.decode(data, digest, size)
        except (OSError, BadBlob, SizeMismatch):
            return self.decode_file(self.blob_path(digest), digest, size)  # the error, from the careful path

    def get_blob(self, digest: Digest) -> bytes | None:
        try:
            return self.load_blob(digest.hash, digest.size)
        except BlobNotFoundError:
            return None

    def put_blob(self, data: bytes, *, use_dictionary: bool = True) -> Digest:
        """Store ``data`` (once per content); returns its Digest."""
        data = bytes(data)
        digest = sha256_hex(data)
        p = self.blob_path(digest)
        if p.is_file():
            try:
                self.codec.decode(p.read_bytes(), digest)
                return Digest(digest, len(data))
            except FileNotFoundError:
                pass  # removed under us (gc): write it again
            except BadBlob as e:
                self.quarantine(p, f"found corrupt while storing it again: {e}")
        self.init()
        dd = self.current_dictionary("blobs") if use_dictionary else None
        try:
            encoded = self.codec.encode(data, dd, digest=digest)
        except RuntimeError as e:  # pragma: no cover
            raise StoreError(f"{e}; not stored") from None
        self.write_file(p, encoded)
        self.counters["blobs_written"] += 1
        return Digest(digest, len(data))

    def put_blob_file(self, digest: str, data: bytes) -> bool:
        """Publish already-encoded blob file bytes (verified first) unless a good copy is there.

        For import/export, which move files without re-encoding. Returns True when written.
        Raises CorruptArtifactError when ``data`` is not blob ``digest``.
        """
        try:
            self.codec.decode(data, digest)
        except (BadBlob, SizeMismatch) as e:
            raise CorruptArtifactError(f"refusing to store blob {digest}: {e}", digest=digest,
                                       reason=str(e)) from None
        p = self.blob_path(digest)
        if p.is_file():
            try:
                self.codec.decode(p.read_bytes(), digest)
                return False
            except FileNotFoundError:
                pass
            except BadBlob as e:
                self.quarantine(p, f"replaced by a verified copy: {e}")
        self.init()
        self.write_file(p, data)
        return True

    # ---- records ----

    def encode_record(self, rec: Mapping[str, Any], dictionary: str | None = None) -> bytes:
        """A record's bytes on disk: its canonical JSON in one zstd frame (blob format), with
        ``dictionary`` (default: the current record dictionary)."""
        if dictionary is None:
            dictionary = self.current_dictionary("records")
        level = RECORD_LEVEL if dictionary is None else self.level
        return self.codec.encode(canonical_json(rec), dictionary, level=level)

    def decode_record(self, data: bytes, key: str) -> dict:
        """Decode and envelope-check record bytes (as :func:`read_record` takes them); raises
        BadRecord (or BadBlob)."""
        return self._decode_record(data, key)[1]

    def _decode_record(self, data: bytes, key: str) -> tuple[bytes, dict]:
        """(the record's JSON text as stored, the record :func:`read_record` takes from it)."""
        try:
            text = self.codec.decode_frame_only(data)
        except BadBlob as e:
            raise BadRecord(f"not a record file: {e}") from None
        try:
            rec = json.loads(text)
        except (ValueError, UnicodeDecodeError) as e:
            raise BadRecord(f"not JSON: {e}") from None
        return text, read_record(rec, key)

    def get_record(self, key: str) -> dict | None:
        """The record stored under ``key``, envelope-checked; None when absent.

        An unreadable record is quarantined and reads as None. Does not check the blob.
        """
        p = self.record_path(key)
        try:
            data = p.read_bytes()
        except FileNotFoundError:
            return None
        try:
            rec = self.decode_record(data, key)
        except DictionaryUnavailable as e:
            self.quarantine(p, f"unreadable record: {e}")
            return None
        except BadRecord as e:
            self.quarantine(p, f"unreadable record: {e}")
            return None
        self._touch(p)
        return rec

    def get_record_named(self, key: str, want: Digest) -> dict | None:
        """The record under ``key`` if it is the one ``want`` (:func:`~gemmar_aot.store.record.record_digest`)
        names, without its volatile fields; None otherwise (absent, unreadable or another record):
        then :meth:`get_record` and ``record_digest`` say which. Quarantines nothing
        (:meth:`get_record` does, on the fallback)."""
        p = self.record_path(key)
        try:
            rec = read_record(json.loads(self.codec.decode_frame_only(p.read_bytes())), key)
        except (OSError, BadBlob, ValueError, UnicodeDecodeError):  # BadRecord is a ValueError
            return None
        if record_digest(rec) != want:
            return None
        self._touch(p)
        return {k: v for k, v in rec.items() if k not in RECORD_VOLATILE_FIELDS}

    def _touch(self, p: Path) -> None:
        """Refresh a hit record's mtime (``gc``'s LRU clock), at most every TOUCH_INTERVAL_S."""
        if self.touch:
            with contextlib.suppress(OSError):
                if time.time() - p.stat().st_mtime > TOUCH_INTERVAL_S:
                    os.utime(p)

    def put_record(self, key: str, record: Mapping[str, Any]) -> None:
        check_record(dict(record), key)
        self.init()
        self.write_file(self.record_path(key), self.encode_record(record))
        self.counters["records_written"] += 1

    def put_record_json(self, key: str, text: bytes, record: Mapping[str, Any] | None = None) -> dict:
        """Store a record given as its JSON text -- as a remote cache served it, already
        verified -- without re-encoding it (pure-Python indented JSON is ~70% of taking a
        fetched entry in). ``record``: the record ``text`` encodes, when the caller has it
        (then the text is not parsed again). Returns the record."""
        try:
            rec = check_record(dict(record) if record is not None else json.loads(text), key)
        except (ValueError, UnicodeDecodeError) as e:
            raise BadRecord(f"not a JSON record: {e}") from None
        self.init()
        dictionary = self.current_dictionary("records")
        level = RECORD_LEVEL if dictionary is None else self.level
        self.write_file(self.record_path(key), self.codec.encode(bytes(text), dictionary, level=level))
        self.counters["records_written"] += 1
        return rec

    def find_missing_records(self, keys: Iterable[str]) -> set[str]:
        return {k for k in keys if not self.record_path(k).is_file()}

    # ---- quarantine ----

    def quarantine(self, path: Path, reason: str) -> Path | None:
        """Move ``path`` to ``quarantine/`` with a ``.reason`` note. None if it could not be moved."""
        path = Path(path)
        if path.name.endswith(BLOB_SUFFIX) and is_hex64(path.name[:64]):
            self.codec.forget(path.name[:64])  # decoders cached for a quarantined dictionary must go
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
