"""A lock file's bytes: JSON Lines (a head naming each rank's part by :class:`~.types.Digest`,
then one line per part), plain or in one zstd frame (an artifact wheel's ``lock.json.zst``)."""

from __future__ import annotations

from typing import Any, Mapping

from gemmar_aot.util.canonical_json import canonical_json_line
from gemmar_aot.model.types import Digest
from gemmar_aot.model.schema import LockFileError

#: The first four bytes of a zstd frame: a lock file starting with them is compressed JSON.
LOCK_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
#: A compressed lock larger than this when decompressed is refused (the reference lock is ~0.25 MB).
MAX_LOCK_BYTES = 256 << 20


def plain_lock_bytes(data: bytes, where: str = "<lock>") -> bytes:
    """A lock file's canonical bytes: ``data`` itself, or the bytes inside its zstd frame (an artifact
    wheel's ``lock.json.zst``). What a lock's sha256 -- and its signature -- is of."""
    return decompress_lock(data, where) if data[:4] == LOCK_ZSTD_MAGIC else data


def decompress_lock(data: bytes, where: str) -> bytes:
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
