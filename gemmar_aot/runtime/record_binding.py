"""Each lock entry is the action-cache record it names, and that record compiled what the lock
launches where the entry sits: :class:`RecordBinding`, reading each record once (from the lock's
record index, else the store), and the identities it compares launch records by.

:mod:`.kernel_checks` runs it for every op, between the launch-sequence check and the code objects.
"""

from __future__ import annotations

from json.encoder import encode_basestring_ascii as _json_string
from typing import Any, Iterable

from gemmar_aot.model.launch import LaunchRecord, LaunchRecordError
from gemmar_aot.model.spec import canonical_json
from gemmar_aot.store.backend import RECORD_SCHEMA, BadRecord, check_record, record_blob
from gemmar_aot.store.record import record_digest
from gemmar_aot.store.record_index import RecordIndexError, parse_lines

from .artifact_errors import ArtifactMismatchError


class RecordBinding:
    """Checks lock entries against the action-cache records they name, reading each record once.

    For every entry: the record under the entry's action key must be the one the lock
    names (``store.record.record_digest``), hold the same code object and launch
    record, and its spec must describe the kernel the lock launches where the entry sits
    (:func:`binding_problems`). A lock and a store that disagree are refused with a
    message naming both. So is a lock whose record cannot be found or read: the check never
    fails open (a lock-only edit -- another grid, swapped arguments -- is caught only here).

    Where the records come from: the lock's record index when it has one
    (:mod:`gemmar_aot.store.record_index`, one file beside the lock, each line verified
    against the record digest the lock names; see :meth:`use_index`), else the store's
    record files one by one.
    """

    def __init__(self):
        self._checked: dict[str, Any] = {}  # action key -> the record (None: the store has none)
        self._indexed: dict[str, Any] = {}  # action key -> (index, the record or the digest its line has)

    def use_index(self, index: Any, entries: Iterable[Any]) -> None:
        """Take the records of ``entries`` from the record ``index`` of their lock: every line
        restored and checked against the record digest the lock names, in one go. A line that is
        not the named record is refused when its entry is checked.

        A verified line whose read half starts with the entry's :func:`envelope` -- the blob,
        key and launch record the lock gives, byte for byte -- is bound by those bytes: only
        what follows (the spec) is parsed. Any other line is parsed whole and compared member
        by member (:meth:`check`), which names what differs."""
        todo = {e.key: e for e in entries if e.key not in self._indexed and e.key not in self._checked}
        got = index.verified_lines((key, e.record, e.blob.hash) for key, e in todo.items())
        texts, parsed = [], []
        for key, halves in got.items():
            if type(halves) is not tuple:
                self._indexed[key] = (index, halves, False)
                continue
            read, env = halves[0], envelope(todo[key])
            enveloped = read.startswith(env)
            texts.append(b"{" + read[len(env):] if enveloped else read)
            parsed.append((key, enveloped))
        if texts:
            for (key, enveloped), record in zip(parsed, parse_lines(texts, index.path)):
                if enveloped and type(record) is dict:  # the members the envelope stood for
                    e = todo[key]
                    record.update(key=key, blob=e.blob.to_json())
                self._indexed[key] = (index, record, enveloped)

    def use_indexes(self, artifacts: Any, rank_entries: Iterable[Any]) -> None:
        """:meth:`use_index` for each lock of ``rank_entries`` (RankEntry) that has a record index."""
        by_lock: dict[int, tuple[Any, list]] = {}
        for e in rank_entries:
            by_lock.setdefault(id(e.lock), (e.lock, []))[1].extend((*e.launches, *e.self_test))
        for info, launch_entries in by_lock.values():
            index = artifacts.record_index(info)
            if index is not None:
                try:
                    self.use_index(index, launch_entries)
                except RecordIndexError as exc:  # a group of lines damaged: read when first needed
                    raise ArtifactMismatchError(f"{exc} (lock {info.source})") from None

    def check(self, store: Any, entry: Any, pos: Any, *, lock_where: str) -> None:
        """Raise ArtifactMismatchError on a disagreement, or when the record the entry names is
        neither in a record index beside the lock nor readable in the store."""
        key = entry.key
        if key in self._checked:
            record = self._checked[key]
        elif key in self._indexed:
            index, got, enveloped = self._indexed.pop(key)
            if got is None:
                raise self._bad(store, entry, pos, lock_where,
                                f"the lock was made from record {entry.record.hash}, the record index beside it "
                                f"has no record for that key: it was written for another lock. Delete the "
                                f"index to check the store's records one by one",
                                store_where=f"{index.path} (action key {key})")
            if not isinstance(got, dict):
                raise self._bad(store, entry, pos, lock_where,
                                f"the lock was made from record {entry.record.hash} ({entry.record.size} bytes), the "
                                f"record index holds {got.hash} ({got.size} bytes) for that key",
                                store_where=f"{index.path} (action key {key})")
            record = got
            try:
                if not enveloped or record.get("schema") != RECORD_SCHEMA:
                    check_record(record, key)  # (enveloped: its key and blob are the entry's own)
            except BadRecord as exc:
                raise self._bad(store, entry, pos, lock_where, f"the record is malformed ({exc})",
                                store_where=f"{index.path} (action key {key})") from None
            self._check_record(store, entry, record, pos, lock_where, digest_checked=True,
                               launch_checked=enveloped, store_where=f"{index.path} (action key {key})")
            self._checked[key] = record
        else:
            # the record file alone: the blob is loaded and verified right after, by digest.
            # First the record the lock names, hashed as stored (no re-encoding); anything
            # else -- another record, another layout, none -- takes the full path below.
            want = getattr(entry, "record", None)
            named = getattr(store, "read_record_named", None)
            record = named(key, want) if named is not None and want is not None else None
            if record is not None:
                self._check_record(store, entry, record, pos, lock_where, digest_checked=True)
            else:
                read = getattr(store, "read_record_file", None)
                record = read(key) if read is not None else store.get_record(key)
                if record is not None:
                    self._check_record(store, entry, record, pos, lock_where)
            self._checked[key] = record
        if record is None:
            raise self._bad(store, entry, pos, lock_where,
                            f"the lock names record {entry.record.hash} ({entry.record.size} bytes), and neither "
                            f"a record index beside the lock nor the store has it readable (an installed "
                            f"wheel's lock.records.zst removed, or a record file missing or damaged: a damaged "
                            f"one is moved to the store's quarantine/). Nothing of this lock is checked without "
                            f"it: reinstall the artifact wheel, or rebuild the manifest into this store")
        problems = pos.problems(record.get("spec"))
        if problems:
            raise self._bad(store, entry, pos, lock_where, "the record compiled " + "; ".join(problems))

    def _check_record(self, store: Any, entry: Any, record: dict, pos: Any, lock_where: str, *,
                      digest_checked: bool = False, launch_checked: bool = False,
                      store_where: str | None = None) -> None:
        want = getattr(entry, "record", None)
        if want is not None and not digest_checked:
            got = record_digest(record)
            if got != want:
                raise self._bad(store, entry, pos, lock_where,
                                f"the lock was made from record {want}, the store holds {got}")
        if record.get("key") != entry.key:
            raise self._bad(store, entry, pos, lock_where, f"the record is for action key {record.get('key')}",
                            store_where=store_where)
        if record.get("blob") != entry.blob.to_json():  # (every record here passed check_record)
            blob = record_blob(record)
            raise self._bad(store, entry, pos, lock_where,
                            f"the lock names code object {entry.blob.hash[:16]} ({entry.blob.size} bytes), the "
                            f"record {blob.hash[:16]} ({blob.size} bytes)", store_where=store_where)
        if launch_checked:
            return  # its bytes were the lock's launch record's (envelope)
        raw = record.get("launch") or {}
        if _launch_json_identity(raw) == _lock_launch_identity(entry.launch):
            return  # the same JSON (the common case, no parse); else compare them as launch records
        try:
            launch = LaunchRecord.from_json(raw)
        except LaunchRecordError as exc:
            raise self._bad(store, entry, pos, lock_where, f"the record's launch record is malformed ({exc})",
                            store_where=store_where) from None
        if launch_identity(launch) != launch_identity(entry.launch):
            raise self._bad(store, entry, pos, lock_where, "the lock's launch record is not the record's",
                            store_where=store_where)

    @staticmethod
    def _bad(store: Any, entry: Any, pos: Any, lock_where: str, why: str, *,
             store_where: str | None = None) -> ArtifactMismatchError:
        if store_where is None:
            describe = getattr(store, "describe_record", None)
            store_where = describe(entry.key) if describe else str(store.record_path(entry.key))
        return ArtifactMismatchError(
            f"the lock and the store disagree about {pos.label} (action key "
            f"{entry.key[:16]}): {why}. Lock: {lock_where}. Store record: {store_where}. Rebuild the manifest "
            f"into this store (gemmar-aot build) so both come from one build, or point artifacts= at the lock "
            f"that store was built with")


_LAUNCH_IDENTITY_CACHE: dict[int, tuple] = {}
_LAUNCH_JSON_CACHE: dict[int, tuple] = {}  # id(record) -> (record, its canonical JSON)
_LAUNCH_JSON_PARTS: dict[tuple, tuple] = {}  # its fields' ids -> (fields, JSON before the symbol, after)


def envelope(entry: Any) -> bytes:
    """How the read half of the record a lock entry names (``record_halves``) starts when it is
    the record the lock describes: its canonical JSON up to and including the comma after the
    launch record -- the blob, the action key and the launch record the entry gives, the
    members sorted as canonical JSON sorts them. Nothing but those three values can fill these
    bytes, so a verified line that starts with them agrees with the entry on all three."""
    return b'{"blob":{"hash":"%s","size":%d},"key":"%s","launch":%s,' % (
        entry.blob.hash.encode(), entry.blob.size, entry.key.encode(), launch_json(entry.launch))


def launch_json(rec: Any) -> bytes:
    """``canonical_json(rec.to_json())``, as bytes, made once per record object. A lock gives each
    kernel symbol a copy of one of a few launch records (the same field objects, another
    ``kernel``): the rest is encoded once per record and the symbol put in its sorted place
    (after ``grid``, before ``kernel_arg_types``)."""
    got = _LAUNCH_JSON_CACHE.get(id(rec))
    if got is not None and got[0] is rec:
        return got[1]
    fields = (rec.args, rec.block, rec.grid, rec.kernel_arg_types, rec.kernel_args, rec.params, rec.program)
    key = (*map(id, fields), rec.stream_param)
    parts = _LAUNCH_JSON_PARTS.get(key)
    if parts is None or any(a is not b for a, b in zip(parts[0], fields)):  # the fields are kept: no id reused
        d = rec.to_json()
        head = canonical_json({k: v for k, v in d.items() if k < "kernel"})[:-1].encode()
        tail = canonical_json({k: v for k, v in d.items() if k > "kernel"})[1:].encode()
        if len(_LAUNCH_JSON_PARTS) >= 4096:
            _LAUNCH_JSON_PARTS.clear()
        parts = _LAUNCH_JSON_PARTS[key] = (fields, head + b',"kernel":', b"," + tail)
    if len(_LAUNCH_JSON_CACHE) >= 4096:
        _LAUNCH_JSON_CACHE.clear()
    # the symbol as canonical_json writes a string (ASCII, escaped), without making an encoder
    got = _LAUNCH_JSON_CACHE[id(rec)] = (rec, parts[1] + _json_string(rec.kernel).encode() + parts[2])
    return got[1]


def _lock_launch_identity(rec: Any) -> tuple:
    """The JSON identity of a lock's launch record (cached per object: a lock shares a few)."""
    got = _LAUNCH_IDENTITY_CACHE.get(id(rec))
    if got is None or got[0] is not rec:
        got = _LAUNCH_IDENTITY_CACHE[id(rec)] = (rec, _launch_json_identity(rec.to_json()))
        if len(_LAUNCH_IDENTITY_CACHE) > 4096:
            _LAUNCH_IDENTITY_CACHE.clear()
    return got[1]


def _launch_json_identity(d: Any) -> tuple:
    """A launch record's JSON without its kernel symbol (the lock stores records once, symbol-free)."""
    if not isinstance(d, dict):
        return (None,)
    return tuple((k, d.get(k)) for k in _LAUNCH_FIELDS)


_LAUNCH_FIELDS = ("params", "args", "kernel_args", "kernel_arg_types", "program", "grid", "block", "stream_param")


def launch_identity(rec: Any) -> tuple:
    """A launch record without its kernel symbol (the lock stores records once, symbol-free)."""
    return (rec.params, rec.args, rec.kernel_args, rec.kernel_arg_types, rec.program, rec.grid, rec.block,
            rec.stream_param)


class _RecordKey:
    """A launch record's identity (its symbol aside) as a dict key whose hash is computed once:
    a record is a deep tuple, and one construction looks each one up several times."""

    __slots__ = ("ident", "hash")

    def __init__(self, ident: tuple):
        self.ident, self.hash = ident, hash(ident)

    def __hash__(self) -> int:
        return self.hash

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _RecordKey) and self.hash == other.hash and self.ident == other.ident


def record_key(record: LaunchRecord, cache: dict) -> _RecordKey:
    """``record``'s identity key, made once per record object within one construction (``cache``),
    and shared by the records whose fields are the same objects (a lock gives each kernel symbol
    a copy of one launch record): a record's hash walks every argument and instruction."""
    got = cache.get(id(record))
    if got is None or got[0] is not record:
        ident = launch_identity(record)
        fields = ("fields", *map(id, ident))
        shared = cache.get(fields)
        if shared is None or any(a is not b for a, b in zip(shared[0], ident)):  # kept: no id reused
            shared = cache[fields] = (ident, _RecordKey(ident))
        got = cache[id(record)] = (record, shared[1])
    return got[1]
