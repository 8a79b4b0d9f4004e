"""The store's backend seam: where action-cache records and blobs live.

Modelled on Triton's ``runtime/cache.py`` (a small cache interface, pluggable backends)
and Bazel's remote-execution API (an action cache kept apart from a content-addressed
store, ``Digest(hash, size)``, blobs verified on read, batched existence checks).

A backend holds two maps and nothing else:

- **action cache**: key (64 hex, our sha256 of a compile's inputs) -> record, a JSON
  object ``{"schema", "key", "blob": {"hash", "size"}, ...}`` (:func:`check_record`);
- **CAS**: :class:`Digest` -> the blob's *plain* bytes, addressed by the sha256 of those
  bytes (never of an encoding: zstd is a backend's private business).

How a backend plugs in
----------------------
Subclass :class:`CacheBackend` and implement the five abstract methods; the batched
``find_missing_*`` default to loops and are worth overriding when a round trip is
expensive (HTTP: ``HEAD`` in parallel). The contract every backend keeps:

1. ``get_blob`` returns only bytes that hash to the digest (check them with
   :func:`gemmar_aot.store.blob_codec.check_content`, or decode through
   :class:`~gemmar_aot.store.blob_codec.BlobCodec`); a bad blob raises
   :class:`~gemmar_aot.store.store_errors.CorruptArtifactError`, an absent one returns None.
2. ``get_record`` returns only records that :func:`read_record` takes for that key, else
   None. It does not promise the blob exists: the caller (:class:`~gemmar_aot.store.Store`)
   treats a record whose blob is missing as a miss, never as an error.
3. ``put_blob`` before ``put_record``: a reader must never find a record whose blob is
   still being written. Both are idempotent (content addressing makes a re-put harmless).
4. Nothing a backend returns is trusted further than 1-2: the :class:`Store` re-verifies
   a remote blob before it writes it into the local store or hands it to a caller.

:class:`~gemmar_aot.store.Store` layers backends: the local directory
(:class:`~gemmar_aot.store.local.DirectoryBackend`) in front of an optional ``remote``
one -- reads go local first and copy a verified remote hit into the local store
(read-through); puts go to the local store, then to a writable remote, blob first
(write-through). A remote that fails is the Store's problem to report, never a wrong
answer: any exception a remote raises becomes a miss (``counters["remote_errors"]``).
A read-only remote (``writable = False``) is never written.

Runtime-safe: standard library only.
"""

from __future__ import annotations

import abc
from collections.abc import Iterable, Mapping
from typing import Any

from gemmar_aot.model.types import Digest

#: Version of the record envelope (schema, key, blob, launcher); the rest of a record is the caller's.
#: 2: ``blob`` and ``launcher`` are spelled as every Digest is on disk, ``{"hash", "size"}``
#:    (:meth:`Digest.to_json`, as a lock spells them). Schema 1 spelled them ``{"digest", "size"}``:
#:    :func:`read_record` takes such a record in as a stale one (:data:`_SCHEMA1_REFS`).
RECORD_SCHEMA = 2
#: The members the store itself writes into a record (``Store.put``).
RESERVED_FIELDS = ("schema", "key", "blob", "launcher")
#: What a record of schema 1 (gemmar-aot before record schema 2) named its blobs with.
_SCHEMA1_REFS = ("blob", "launcher")


class BadRecord(ValueError):
    """A record that fails the envelope check. ``str(e)`` is the reason."""


def check_record(rec: Any, key: str) -> dict:
    """``rec`` if it is a record of this schema for ``key`` with valid blob references; else
    BadRecord. What every backend checks before it writes a record: only schema 2 is written."""
    if not isinstance(rec, dict):
        raise BadRecord("not a JSON object")
    if rec.get("schema") != RECORD_SCHEMA:
        raise BadRecord(f"record schema {rec.get('schema')!r}, expected {RECORD_SCHEMA}")
    if rec.get("key") != key:
        raise BadRecord(f"record is for key {rec.get('key')!r}, stored under {key}")
    for member in ("blob", "launcher") if "launcher" in rec else ("blob",):
        try:
            Digest.from_json(rec.get(member))
        except ValueError:
            raise BadRecord(f"record has no valid {member} reference: {rec.get(member)!r}") from None
    return rec


def read_record(rec: Any, key: str) -> dict:
    """A record as a backend read it, :func:`check_record`'d, in this schema.

    A record of schema 1 -- written by a gemmar-aot before record schema 2, in a user's store or
    remote cache -- is taken in as a *stale* record of schema 2: its blob references respelled
    (``{"digest", "size"}`` -> ``{"hash", "size"}``) and its derive stamp cleared. A build then
    derives it again from its verified blobs, as it does any record of other derive code
    (``compiler.derive.rederive``: zero compiles), and writes it back in schema 2; every other
    reader sees schema 2 only. Nothing is rewritten here."""
    if isinstance(rec, dict) and rec.get("schema") == 1 and rec.get("key") == key:
        old = rec
        rec = {**old, "schema": RECORD_SCHEMA}
        for member in _SCHEMA1_REFS:
            ref = old.get(member)
            if isinstance(ref, dict) and ref.keys() == {"digest", "size"}:
                rec[member] = {"hash": ref["digest"], "size": ref["size"]}
        derive = old.get("derive")
        rec["derive"] = {**(derive if isinstance(derive, dict) else {}), "code": None}
    return check_record(rec, key)


def record_blob(rec: Mapping[str, Any]) -> Digest:
    """The digest of the blob a (checked) record names (not :func:`gemmar_aot.store.record.record_digest`,
    the digest of the record itself)."""
    return Digest.from_json(rec["blob"])


def record_launcher(rec: Mapping[str, Any]) -> Digest | None:
    """The digest of the launcher blob a (checked) record names (the compile's second output,
    what ``compiler.derive`` re-derives from), None for a record without one."""
    return Digest.from_json(rec["launcher"]) if "launcher" in rec else None


def record_blobs(rec: Mapping[str, Any]) -> list[Digest]:
    """Every blob a (checked) record names: its code object, then its launcher if any. What
    must be kept (gc), copied (export) and uploaded with it."""
    ln = record_launcher(rec)
    return [record_blob(rec)] + ([ln] if ln is not None else [])


class CacheBackend(abc.ABC):
    """One place that holds action-cache records and blobs. See the module docstring."""

    #: Shown in messages and counters ("local", "http://host:port/prefix", ...); never a credential.
    name: str = "backend"
    #: False: the Store never calls put_* (a read-only mirror, ``--remote-read-only``).
    writable: bool = True

    # ---- action cache ----

    @abc.abstractmethod
    def get_record(self, key: str) -> dict | None:
        """The record stored under ``key`` (as :func:`read_record` takes it), or None."""

    @abc.abstractmethod
    def put_record(self, key: str, record: Mapping[str, Any]) -> None:
        """Store ``record`` under ``key`` (its blob must already be in this backend)."""

    def get_record_named(self, key: str, want: Any) -> dict | None:
        """The record under ``key`` only when it is the one the digest ``want`` names, checked
        over its stored bytes; None when this backend has no such shortcut (the caller then
        reads the record with :meth:`get_record` and checks its digest itself). A backend
        without an action cache (an installed wheel's pack) has nothing to return."""
        return None

    def find_missing_records(self, keys: Iterable[str]) -> set[str]:
        """The keys of ``keys`` this backend has no record for (batched lookup)."""
        return {k for k in keys if self.get_record(k) is None}

    # ---- CAS ----

    @abc.abstractmethod
    def get_blob(self, digest: Digest) -> bytes | None:
        """The verified plain bytes of ``digest``; None when absent; CorruptArtifactError when bad."""

    @abc.abstractmethod
    def put_blob(self, data: bytes) -> Digest:
        """Store ``data`` (once per content); returns its digest."""

    @abc.abstractmethod
    def contains_blob(self, digest: Digest) -> bool:
        """Whether ``digest`` is present (cheap: existence, not verification)."""

    def find_missing_blobs(self, digests: Iterable[Digest]) -> set[Digest]:
        """The digests of ``digests`` not present (Bazel's FindMissingBlobs)."""
        return {d for d in digests if not self.contains_blob(d)}

    def close(self) -> None:
        """Release connections and the like (default: nothing)."""
