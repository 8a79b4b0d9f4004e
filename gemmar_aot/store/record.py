"""The action-cache record's digest: what a lock names each record by, over the record's two
halves (the members the runtime reads, and the rest), so a reader may parse one half only."""

from __future__ import annotations

from typing import Any, Mapping

from gemmar_aot.model.spec import canonical_json
from gemmar_aot.model.types import Digest
from gemmar_aot.util.filedigest import sha256_hex

#: Record fields that differ between two compiles of one key (timings) or between the builders
#: that share one (who vouched for it: ``builder.compile_vouch``): a record's digest leaves them
#: out, so the same manifest and toolchain give the same lock in any store.
#: The record member holding the compile-key signatures over it (``builder.compile_vouch``).
VOUCHED_FIELD = "vouched"
RECORD_VOLATILE_FIELDS = ("compile_seconds", VOUCHED_FIELD)


#: The members of an action-cache record the runtime reads when it binds a lock entry to its
#: record (the envelope, the launch record, the spec, and for a JIT v2 kernel the cache entry mori
#: published it at); the rest -- the ``ingredients`` and the kernel ``metadata``, most of a
#: record's bytes -- it never reads. :func:`record_digest` hashes the two apart, so a reader can
#: check a record whole and parse only what it reads. (A member only some records have moves no
#: other record's digest.)
RECORD_READ_MEMBERS = ("blob", "key", "launch", "mori_cache_entry", "schema", "spec")


def record_halves(record: Mapping[str, Any]) -> tuple[bytes, bytes]:
    """The canonical JSON (``canonical_json``) of a record's :data:`RECORD_READ_MEMBERS` and of
    its other members but :data:`RECORD_VOLATILE_FIELDS`: what :func:`record_digest` hashes."""
    read = {k: record[k] for k in RECORD_READ_MEMBERS if k in record}
    rest = {k: v for k, v in record.items() if k not in RECORD_READ_MEMBERS and k not in RECORD_VOLATILE_FIELDS}
    return canonical_json(read).encode(), canonical_json(rest).encode()


def record_digest_of_halves(read: bytes, rest: bytes) -> Digest:
    """The record digest of a record whose halves (:func:`record_halves`) are these bytes: the
    Digest of :func:`record_digest_text`."""
    return Digest.of(record_digest_text(read, rest))


def record_digest_text(read: bytes, rest: bytes) -> bytes:
    """What the record digest of a record with these halves is the digest of:
    ``{"read": sha256(read), "rest": sha256(rest)}`` in canonical JSON."""
    return (b'{"read":"' + sha256_hex(read).encode() + b'","rest":"'
            + sha256_hex(rest).encode() + b'"}')


def is_record_digest(text: bytes, want: Digest) -> bool:
    """Whether ``want`` is the Digest of ``text`` (:func:`record_digest_text`), without making one."""
    return len(text) == want.size and sha256_hex(text) == want.hash


def record_digest(record: Mapping[str, Any]) -> Digest:
    """The digest a lock names for an action-cache record (timings left out, so the same
    manifest and toolchain give the same lock in any store).

    It commits to every byte of the record, as a hash of the whole would, in two halves
    (:func:`record_halves`): the members the runtime reads, and the rest. A record index
    line carries both halves' bytes; the runtime hashes both (C speed) but parses only the
    first (:mod:`gemmar_aot.store.record_index`)."""
    return record_digest_of_halves(*record_halves(record))
