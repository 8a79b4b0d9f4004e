"""A lock's record index: every action-cache record a lock was made from, in one file.

The runtime binds each lock entry to the record it was made from (the lock names each
record's digest, :func:`gemmar_aot.store.record.record_digest`; see
``gemmar_aot.runtime.record_binding.RecordBinding``). Reading those records one file at a time
costs a rank 53 file opens, zstd frames and JSON texts at startup. The build therefore
writes, next to each lock file, the records that lock names in one file::

    locks/<manifest>.lock.json        the lock
    locks/<manifest>.records.zst      its record index (an artifact wheel: lock.records.zst)

Format (schema :data:`INDEX_SCHEMA`): zstd frames, each with its content size and checksum.
The first holds a header (canonical JSON)::

    {"format": "gemmar-aot record index", "schema": 5, "kernels": N, "prefix_hex": P,
     "groups": [[FRAME_BYTES, "PREFIXES"], ...]}

then one frame per group follows, FRAME_BYTES long, holding that group's lines separated by
newlines; PREFIXES is the group's key prefixes, concatenated in line order. The build groups
the lines by rank (:func:`lock_rank_groups`), so a rank getting ready decompresses and splits
its own ~1/world of the file and nothing else. Each line is one record, by action key, sorted
within its group: the key's first P hex digits (P >= 8, enough to tell the lock's keys
apart), then the record's two halves as :func:`~gemmar_aot.store.record.record_digest`
hashes them (``record_halves``): the members the runtime reads, ``\x1f`` (a byte canonical
JSON never holds raw), the other members. The first half is abridged by the record's own
action key and blob digest, which the lock already holds: ``"key":""`` and
``"blob":{"hash":""`` stand for them (the reader puts the lock's values back); a line
starting with ``=`` holds it verbatim (written when abridging would not round trip). In the
second half ``"derive":{"code":C,"key":""`` stands for the record's derive key
when it is the one its blob, its launcher and C give (:func:`derive_key_of`): a sha256 per
record that compresses to nothing, a tenth of a wheel.

Nothing in the index is trusted by itself. A reader restores each line it needs with the
lock's key and blob digest, hashes both halves, and compares the digest they give with the
record digest the lock names for that key: a tampered line, or a line of another record, is
refused naming both digests; a key the index lacks means it was written for another lock,
and is refused too. Only then is the first half parsed -- the runtime never parses a
record's ``ingredients`` or kernel ``metadata``, more than half its bytes. A lock without an
index (an older store, a lock handed over as data) is checked against the records one by
one, as before.

Schemas 1 and 2 held whole records, for the record digests of lock schemas 1 and 2; schemas 3
and 4 held records of record schema 1 (blobs spelled ``{"digest", "size"}``), for lock schemas
3 and 4. Those locks are refused, and so are their indexes, with the same fix (rebuild).

Deterministic: the same lock (and so the same named records) gives the same index bytes for a
given libzstd. Runtime-safe: standard library + ``zstandard``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from gemmar_aot.model.types import Digest
from gemmar_aot.store.record import (
    is_record_digest, record_digest, record_digest_text, record_halves
)
from gemmar_aot.util.atomic_write import atomic_write_bytes
from gemmar_aot.model.spec import canonical_json

from ._fs import read_if_present
from .store_errors import StoreError
from gemmar_aot.util.filedigest import sha256_hex

INDEX_SCHEMA = 5
#: Schemas this reader understands. 3 and 4 held records of record schema 1, for the record
#: digests of lock schemas 3 and 4, which are refused; so are those indexes, with the same fix.
READABLE_SCHEMAS = (5,)
INDEX_FORMAT = "gemmar-aot record index"
ZSTD_LEVEL = 19
#: Key prefixes name the lines: at least this many hex digits (32 bits; longer when two keys of one
#: lock share one). A prefix only finds a line: the line is verified against the lock's digest.
MIN_PREFIX_HEX = 8
#: An index larger than this when decompressed is refused (the reference lock's is ~1.4 MB).
MAX_INDEX_BYTES = 256 << 20
_VERBATIM = b"="
#: Between a line's two halves (canonical JSON escapes control bytes inside strings and never
#: writes one outside).
_SEP = b"\x1f"


class RecordIndexError(StoreError):
    """A record index that cannot be used: damaged, another schema, or written for another lock."""


class RecordIndexSchemaError(RecordIndexError):
    """An index of a schema this gemmar-aot does not read (written with a lock of another schema):
    not damage."""


class RecordMissingError(RecordIndexError):
    """A record the lock names is not in the store (no index can be made from it)."""


def _markers(key: str, blob: str) -> tuple[bytes, bytes, bytes, bytes]:
    return (b'"key":"' + key.encode() + b'"', b'"key":""',
            b'"blob":{"hash":"' + blob.encode() + b'"', b'"blob":{"hash":""')


def _restore(read: bytes, key: str, blob: str) -> bytes:
    if read[:1] == _VERBATIM:
        return read[1:]
    full_key, short_key, full_blob, short_blob = _markers(key, blob)
    return read.replace(short_blob, full_blob, 1).replace(short_key, full_key, 1)


#: The derive stamp and the launcher reference in a record's second half (canonical JSON).
_DERIVE_CODE = b'"derive":{"code":"'
_DERIVE_KEY_AT = b'","key":"'
_LAUNCHER_DIGEST = b'"launcher":{"hash":"'


def derive_key_of(blob: str, launcher: str, derive_code: str) -> str:
    """The derive key a record made from ``blob`` and ``launcher`` by derive code ``derive_code``
    carries: what ``gemmar_aot.compiler.derive.derive_key`` computes (a test holds the two equal;
    were they ever to differ, lines would be written whole, never restored wrong: a restored line
    must still hash to the lock's record digest)."""
    return sha256_hex(b'{"code_object":"%s","derive_code":"%s","launcher":"%s"}'
                          % (blob.encode(), derive_code.encode(), launcher.encode()))


def _derive_parts(rest: bytes) -> tuple[int, str, str] | None:
    """(where the derive key starts, derive code digest, launcher digest) in a second half, or None."""
    c = rest.find(_DERIVE_CODE)
    ln = rest.find(_LAUNCHER_DIGEST)
    if c < 0 or ln < 0:
        return None
    c += len(_DERIVE_CODE)
    k = c + 64
    if rest[k:k + len(_DERIVE_KEY_AT)] != _DERIVE_KEY_AT:
        return None
    ln += len(_LAUNCHER_DIGEST)
    return k + len(_DERIVE_KEY_AT), rest[c:c + 64].decode("ascii", "replace"), rest[ln:ln + 64].decode(
        "ascii", "replace")


def _restore_rest(rest: bytes, blob: str) -> bytes:
    parts = _derive_parts(rest)
    if parts is None or rest[parts[0]:parts[0] + 1] != b'"':
        return rest  # not abridged (a line written whole)
    at, code, launcher = parts
    return rest[:at] + derive_key_of(blob, launcher, code).encode() + rest[at:]


def _abridge_rest(rest: bytes, blob: str) -> bytes:
    parts = _derive_parts(rest)
    if parts is None:
        return rest
    at, code, launcher = parts
    if rest[at:at + 64] != derive_key_of(blob, launcher, code).encode() or rest[at + 64:at + 65] != b'"':
        return rest
    line = rest[:at] + rest[at + 64:]
    return line if _restore_rest(line, blob) == rest else rest


def _abridge(read: bytes, key: str, blob: str) -> bytes:
    full_key, short_key, full_blob, short_blob = _markers(key, blob)
    line = read.replace(full_key, short_key, 1).replace(full_blob, short_blob, 1)
    return line if _restore(line, key, blob) == read else _VERBATIM + read


def encode_line(record: Mapping[str, Any], key: str, blob: str) -> bytes:
    """A record's line, without its key prefix: its halves (``record_halves``), the first abridged."""
    read, rest = record_halves(record)
    return _abridge(read, key, blob) + _SEP + _abridge_rest(rest, blob)


def prefix_length(keys: Sequence[str]) -> int:
    """The shortest key prefix (at least :data:`MIN_PREFIX_HEX` hex digits) that tells ``keys`` (sorted) apart."""
    n = MIN_PREFIX_HEX
    while n < 64 and any(a[:n] == b[:n] for a, b in zip(keys, keys[1:])):
        n += 4
    return n


def encode_index(entries: Mapping[str, tuple[Mapping[str, Any], str]], *, groups: Sequence[Iterable[str]] = (),
                 level: int = ZSTD_LEVEL) -> bytes:
    """The index bytes of ``entries``: action key -> (the record, its blob digest).

    ``groups``: key sets, in order (e.g. :func:`lock_rank_groups`); a key goes to the first group
    naming it, keys of no group to one last group. Empty groups are left out."""
    keys = sorted(entries)
    n = prefix_length(keys)
    placed: set[str] = set()
    frames: list[list[str]] = []
    for g in (*groups, keys):
        members = sorted(k for k in set(g) if k in entries and k not in placed)
        placed.update(members)
        if members:
            frames.append(members)
    import zstandard

    cctx = zstandard.ZstdCompressor(level=level, write_checksum=True, write_content_size=True)
    blobs, table = [], []
    for members in frames:
        lines = []
        for k in members:
            record, blob = entries[k]
            lines.append(k[:n].encode() + encode_line(record, k, blob))
        blobs.append(cctx.compress(b"\n".join(lines)))
        table.append([len(blobs[-1]), "".join(k[:n] for k in members)])
    head = canonical_json({"format": INDEX_FORMAT, "schema": INDEX_SCHEMA, "kernels": len(keys),
                           "prefix_hex": n, "groups": table}).encode()
    return cctx.compress(head) + b"".join(blobs)


def build_index(kernels: Mapping[str, Any], record_of: Callable[[str], Mapping[str, Any] | None], *,
                groups: Sequence[Iterable[str]] = ()) -> bytes:
    """The index for a lock whose kernels are ``kernels`` (action key -> LaunchEntry, e.g.
    ``Lock.kernels()``); ``record_of(key)`` gives each record; ``groups`` as for
    :func:`encode_index` (the build passes :func:`lock_rank_groups`). Every record must be the
    one the lock names (its digest): raises RecordIndexError naming both otherwise, or when one
    is absent."""
    entries = {}
    for key, e in kernels.items():
        rec = record_of(key)
        if rec is None:
            raise RecordMissingError(f"no record for action key {key} ({e.kind}); the lock names record "
                                   f"{e.record.hash}: rebuild the manifest into this store")
        got = record_digest(rec)
        if got != e.record:
            raise RecordIndexError(f"the record under action key {key} ({e.kind}) is {got.hash} ({got.size} "
                                   f"bytes), the lock names {e.record.hash} ({e.record.size} bytes): rebuild "
                                   f"the manifest into this store so both come from one build")
        entries[key] = (rec, e.blob.hash)
    return encode_index(entries, groups=groups)


def write_index(path: str | os.PathLike, data: bytes) -> Path:
    """Publish index bytes atomically at ``path``."""
    atomic_write_bytes(path, data)
    return Path(path)


def lock_rank_groups(lock: Any) -> list[list[str]]:
    """A lock's action keys grouped by rank, rank 0 first (what one rank's startup reads), without
    building its launch entries (``RankLaunches.launch_keys``); then the code objects it hands mori
    whole (``hipcc``, ``jitv2``), a group per (arch, NIC variant, host proxy): what one pod can ask for."""
    by_rank: dict[int, list[str]] = {}
    for t in (*lock.tuples, *lock.eps):
        for r in t.ranks:
            launches, self_test = r.launch_keys()
            by_rank.setdefault(r.rank, []).extend((*launches, *self_test))
    whole: dict[tuple, list[str]] = {}
    for h in getattr(lock, "hipcc", ()):
        v = h.variant
        whole.setdefault((v.arch, v.nic, v.host_proxy), []).append(h.entry.key)
    for j in getattr(lock, "jitv2", ()):
        v = j.variant
        whole.setdefault((v.arch, v.nic, 2), []).append(j.entry.key)  # after both hipcc proxy groups
    return [by_rank[r] for r in sorted(by_rank)] + [whole[g] for g in sorted(whole)]


class RecordIndex:
    """A record index read for one lock: its lines by action-key prefix.

    :meth:`read` checks the header; a group's frame is decompressed (and its checksum
    checked) the first time :meth:`records` asks for one of its keys.
    """

    def __init__(self, path: Path, lines: dict[bytes, bytes], prefix_hex: int,
                 groups: Sequence[tuple[bytes, bytes]] = (), kernels: int | None = None):
        self.path = path
        self._lines = lines  # prefix -> line, for the groups read so far
        self._prefix = prefix_hex
        # a group not read yet: its frame and its prefixes
        self._groups: list[tuple[bytes, bytes] | None] = list(groups)
        # prefix -> group number, for the groups mapped so far: a look-up maps groups in order until
        # it finds its prefix (rank 0's first), so a rank maps little more than its own group
        self._group_of: dict[bytes, int] = {}
        self._mapped = 0
        self._kernels = (len(lines) + sum(len(p) for _f, p in groups) // prefix_hex if kernels is None
                         else kernels)

    @classmethod
    def read(cls, path: str | os.PathLike) -> "RecordIndex | None":
        """The index at ``path``; None when there is no file. Raises RecordIndexError when it is
        damaged or of another schema."""
        path = Path(path)
        data = read_if_present(path)
        return None if data is None else cls.from_bytes(data, path)

    @staticmethod
    def _fix(path: Path) -> str:
        return (f"rebuild the manifest (gemmar-aot build) to rewrite the lock and its index together, or "
                f"delete {path} to check the records one by one")

    @classmethod
    def _frame(cls, data: bytes, path: Path) -> tuple[bytes, bytes]:
        """The first zstd frame of ``data``, decompressed and its checksum checked, and the bytes after it."""
        from .blobfmt import FrameError, checked_frame

        try:
            return checked_frame(data, MAX_INDEX_BYTES)
        except FrameError as exc:
            why = {"unchecked": "not a record index (its zstd frame has no checksum or no plausible size)",
                   "truncated": "the record index is truncated"}.get(
                exc.kind, f"the record index does not decompress ({exc.detail}): the file is damaged or was "
                          f"modified")
            raise RecordIndexError(f"{path}: {why}; {cls._fix(path)}") from None

    @classmethod
    def from_bytes(cls, data: bytes, path: Path) -> "RecordIndex":
        fix = cls._fix(path)
        text, rest = cls._frame(data, path)
        first, newline, _body = text.partition(b"\n")
        try:
            head = json.loads(first)
        except ValueError:
            head = None
        if not isinstance(head, dict) or head.get("format") != INDEX_FORMAT:
            raise RecordIndexError(f"{path}: not a gemmar-aot record index (bad header); {fix}")
        schema = head.get("schema")
        if schema not in READABLE_SCHEMAS:
            raise RecordIndexSchemaError(f"{path}: record index schema {schema!r}, this gemmar-aot reads "
                                   f"{', '.join(map(str, READABLE_SCHEMAS))} (an index is written with its "
                                   f"lock); {fix}")
        n, kernels = head.get("prefix_hex"), head.get("kernels")
        damaged = RecordIndexError(f"{path}: a damaged record index header ({first[:200]!r}); {fix}")
        if type(n) is not int or not MIN_PREFIX_HEX <= n <= 64 or type(kernels) is not int:
            raise damaged
        table = head.get("groups")
        if not isinstance(table, list) or newline:
            raise damaged
        groups, pos = [], 0
        for row in table:
            if (not isinstance(row, list) or len(row) != 2 or type(row[0]) is not int or row[0] <= 0
                    or not isinstance(row[1], str) or not row[1] or len(row[1]) % n):
                raise damaged
            groups.append((rest[pos:pos + row[0]], row[1].encode()))
            pos += row[0]
        if pos != len(rest):
            how = "truncated" if pos > len(rest) else "longer than its header says"
            raise RecordIndexError(f"{path}: the record index is {how}; {fix}")
        if sum(len(p) for _f, p in groups) != kernels * n:
            raise RecordIndexError(f"{path}: the header counts {kernels} record lines, its groups name "
                                   f"{sum(len(p) for _f, p in groups) / n:g}; {fix}")
        # (two lines under one prefix are refused when their group is read; a prefix a wrong group
        # also names finds that group's line, which is not the record the lock names: refused)
        return cls(path, {}, n, groups, kernels)

    @staticmethod
    def _by_prefix(lines: list[bytes], n: int, path: Path) -> dict[bytes, bytes]:
        by_prefix = {line[:n]: line for line in lines}
        if len(by_prefix) != len(lines):
            raise RecordIndexError(f"{path}: two record lines share a key prefix; {RecordIndex._fix(path)}")
        return by_prefix

    def _read_group(self, g: int) -> None:
        frame, prefixes = self._groups[g]
        self._groups[g] = None
        text, rest = self._frame(frame, self.path)
        lines = text.split(b"\n")
        n = self._prefix
        if rest or [line[:n] for line in lines] != [prefixes[i:i + n] for i in range(0, len(prefixes), n)]:
            raise RecordIndexError(f"{self.path}: a group of the record index does not hold the lines its "
                                   f"header names; {self._fix(self.path)}")
        self._lines.update(self._by_prefix(lines, n, self.path))

    def _map_group(self, g: int) -> None:
        """Add group ``g``'s prefixes to the look-up (a prefix named by an earlier group keeps it)."""
        self._mapped = g + 1
        group = self._groups[g]
        if group is not None:
            n, prefixes = self._prefix, group[1]
            for i in range(0, len(prefixes), n):
                self._group_of.setdefault(prefixes[i:i + n], g)

    def _line(self, prefix: bytes) -> bytes | None:
        line = self._lines.get(prefix)
        if line is None:
            g = self._group_of.get(prefix)
            while g is None and self._mapped < len(self._groups):
                self._map_group(self._mapped)
                g = self._group_of.get(prefix)
            if g is not None and self._groups[g] is not None:
                self._read_group(g)
                line = self._lines.get(prefix)
        return line

    def __len__(self) -> int:
        return self._kernels

    def verified_lines(self, wanted: Iterable[tuple[str, Digest, str]]) -> dict[str, tuple[bytes, bytes] | Digest | None]:
        """For each (action key, record digest the lock names, blob digest the lock names): the
        line's two halves (:func:`~gemmar_aot.store.record.record_halves`), restored, when they
        hash to that record digest -- else the digest they give, or None when the index has no
        line for the key (it was written for another lock). Nothing is parsed."""
        out: dict[str, tuple[bytes, bytes] | Digest | None] = {}
        n = self._prefix
        for key, want, blob in wanted:
            if key in out:
                continue
            line = self._line(key[:n].encode())
            if line is None:
                out[key] = None
                continue
            read, _sep, rest = line[n:].partition(_SEP)
            read = _restore(read, key, blob)
            rest = _restore_rest(rest, blob)
            text = record_digest_text(read, rest)
            out[key] = (read, rest) if is_record_digest(text, want) else Digest.of(text)
        return out

    def records(self, wanted: Iterable[tuple[str, Digest, str]], *,
                whole: bool = False) -> dict[str, dict | Digest | None]:
        """:meth:`verified_lines`, each verified line parsed: the record's
        :data:`~gemmar_aot.store.record.RECORD_READ_MEMBERS` only, unless ``whole``. The
        verified lines' halves asked for are parsed in one ``json.loads``."""
        out: dict[str, dict | Digest | None] = self.verified_lines(wanted)  # type: ignore[assignment]
        ok = [key for key, got in out.items() if type(got) is tuple]
        if ok:
            texts = [b",".join(out[key]) if whole else out[key][0] for key in ok]  # type: ignore[index]
            values = parse_lines(texts, self.path)
            if whole:  # two values per text
                out.update((key, {**values[2 * i], **values[2 * i + 1]}) for i, key in enumerate(ok))
            else:
                out.update(zip(ok, values))
        return out


def parse_lines(texts: Sequence[bytes], path: Path) -> list:
    """Verified JSON texts (halves of index lines, or what is left of them), parsed in one
    ``json.loads``: the values, in order (a text of two comma-separated values gives two)."""
    try:
        return json.loads(b"[" + b",".join(texts) + b"]")
    except ValueError as exc:  # pragma: no cover - verified canonical JSON always parses
        raise RecordIndexError(f"{path}: verified record lines do not parse ({exc})") from None


def build_index_from_store(lock: Any, store: Any) -> bytes:
    """:func:`build_index` for ``lock`` from the records in ``store`` (a :class:`~gemmar_aot.store.Store`):
    for a store written before the build wrote indexes, and for an artifact wheel."""
    kernels = lock.kernels()

    def record_of(key: str) -> Mapping[str, Any] | None:
        return store.read_record_named(key, kernels[key].record) or store.read_record_file(key)

    return build_index(kernels, record_of, groups=lock_rank_groups(lock))
