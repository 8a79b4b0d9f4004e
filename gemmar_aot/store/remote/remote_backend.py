"""The remote cache as a :class:`~gemmar_aot.store.backend.CacheBackend`: Bazel's HTTP protocol.

Mapping of our store onto Bazel's two namespaces (so bazel-remote with its default AC
validation, or nginx with WebDAV ``PUT``, can host it unchanged)::

    /cas/<sha256>   a blob's plain bytes: a code object, or a record's canonical JSON
    /ac/<key>       an ActionResult (REAPI protobuf, see :mod:`.reapi`) with two or three
                    output files: gemmar-aot/record.json -> the record's digest (its bytes
                    also inlined as the output file's ``contents``),
                    gemmar-aot/code.hsaco -> the code object's digest, and
                    gemmar-aot/launcher.json -> the launcher's (``compiler.launcher``; the
                    derive step's second input), when the record names one

A put uploads the code object (and launcher) and the record JSON to ``/cas/`` before the ActionResult
to ``/ac/`` (bazel-remote checks that the blobs an ActionResult names exist), so a
reader never finds an entry whose blobs were not yet written. The record is inlined in
the ActionResult as well (~1.5 KB): a hit is then two GETs, not three (424 fewer requests
for the reference manifest). A server may drop inlined contents and an older client
never wrote them; the reader then fetches ``/cas/<record digest>``, so both forms work
everywhere. A read checks everything it fetches before anyone uses it: the
ActionResult parses and names both files, the record JSON (inlined or fetched) has the
digest the ActionResult gives, is an envelope for this key, and names the same code
object; a blob's bytes hash to its digest. An entry whose record is neither inlined nor
in ``/cas/`` reads as a miss. Transport failures raise
:class:`~gemmar_aot.store.remote.http.RemoteError` (the :class:`~gemmar_aot.store.Store`
turns those into misses and one warning).

Runtime-safe: standard library + ``zstandard``.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from gemmar_aot.model.types import Digest
from gemmar_aot.util.canonical_json import canonical_json_bytes

from . import reapi
from ..backend import BadRecord, CacheBackend, check_record, read_record, record_blob, record_launcher
from ..blob_codec import BadBlob, SizeMismatch, check_content
from ..store_errors import CorruptArtifactError
from .http import ENV_URL, HttpCache

#: Parallel requests for batched lookups (HEAD) and prefetches.
DEFAULT_JOBS = 8
EMPTY_SHA256 = "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def record_bytes(record: Mapping[str, Any]) -> bytes:
    """The bytes a record travels as: its canonical JSON file form, whose digest a lock names."""
    return canonical_json_bytes(dict(record))


def remote_url(explicit: str | None = None, environ=os.environ) -> str | None:
    """The remote cache URL: ``--remote``, else ``$GEMMAR_AOT_REMOTE``, else None."""
    url = explicit if explicit is not None else environ.get(ENV_URL, "")
    return url.strip() or None


class HttpBackend(CacheBackend):
    """A Bazel HTTP remote cache at ``url`` (``writable=False``: ``--remote-read-only``)."""

    def __init__(self, url: str, *, writable: bool = True, timeout: float | None = None, retries: int = 2,
                 jobs: int = DEFAULT_JOBS, environ=os.environ):
        self.client = HttpCache(url, timeout=timeout, retries=retries, environ=environ)
        self.name = self.client.name
        self.writable = writable
        self.jobs = jobs
        #: Called as ``on_corrupt(where, data, reason)`` with bytes the server got wrong, before
        #: they are refused (the build keeps them in its quarantine). Never given to anyone else.
        self.on_corrupt = None

    def __repr__(self) -> str:
        return f"HttpBackend({self.name!r}, writable={self.writable})"

    @property
    def down(self) -> str | None:
        """Why the remote was given up on in this process (None while it works)."""
        return self.client.down

    @property
    def stats(self) -> dict:
        return dict(self.client.stats)

    def ping(self) -> None:
        """One cheap request (HEAD of the empty blob); raises RemoteError when the server fails."""
        self.client.head("cas", EMPTY_SHA256)

    def _refuse(self, where: str, data: bytes, reason: str) -> None:
        if self.on_corrupt is not None:
            self.on_corrupt(where, data, reason)

    # ---- action cache ----

    def _entry(self, key: str) -> reapi.ActionResult | None:
        data = self.client.get("ac", key)
        if data is None:
            return None
        try:
            ar = reapi.decode_action_result(data)
        except reapi.ProtobufError as e:
            raise BadRecord(f"/ac/{key} is not an ActionResult: {e}") from None
        for path in (reapi.RECORD_PATH, reapi.CODE_PATH):
            f = ar.file(path)
            if f is None:
                raise BadRecord(f"/ac/{key} has no output file {path} (not a gemmar-aot entry)")
        return ar

    def get_record(self, key: str) -> dict | None:
        got = self.get_record_json(key)
        return None if got is None else got[0]

    def get_record_json(self, key: str) -> tuple[dict, bytes] | None:
        """(record, its JSON text as served and verified) for ``key``, or None."""
        ar = self._entry(key)
        if ar is None:
            return None
        rf = ar.file(reapi.RECORD_PATH)
        rd = rf.digest
        if rf.contents:
            raw, where = rf.contents, f"ac/{key}"  # inlined: checked like the /cas/ copy
        else:
            raw, where = self.client.get("cas", rd.hash), f"cas/{rd.hash}"
            if raw is None:
                return None  # the record blob is gone (evicted): a miss
        try:
            check_content(raw, rd.hash, rd.size)
        except (BadBlob, SizeMismatch) as e:
            self._refuse(where, raw, f"record blob of /ac/{key}: {e}")
            raise CorruptArtifactError(f"remote record {self.name}/{where} for key {key}: {e}",
                                       digest=rd.hash, reason=str(e)) from None
        try:
            rec = read_record(json.loads(raw), key)
        except (ValueError, UnicodeDecodeError) as e:
            raise BadRecord(f"{self.name}/cas/{rd.hash}: not a record for {key} ({e})") from None
        cd = ar.file(reapi.CODE_PATH).digest
        if record_blob(rec) != cd:
            raise BadRecord(f"/ac/{key} names code object {cd} but its record names {record_blob(rec)}")
        lf = ar.file(reapi.LAUNCHER_PATH)
        ln = record_launcher(rec)
        if (lf is None) != (ln is None) or (ln is not None and ln != lf.digest):
            raise BadRecord(f"/ac/{key} names launcher {None if lf is None else lf.digest.hash} but its record "
                            f"names {None if ln is None else ln.hash}")
        return rec, raw

    def put_record(self, key: str, record: Mapping[str, Any]) -> None:
        rec = check_record(dict(record), key)
        raw = record_bytes(rec)
        rd = Digest.of(raw)
        self.client.put("cas", rd.hash, raw)
        code, ln = record_blob(rec), record_launcher(rec)
        ar = reapi.ActionResult((
            reapi.OutputFile(reapi.RECORD_PATH, rd, contents=raw),
            reapi.OutputFile(reapi.CODE_PATH, code),
        ) + (() if ln is None else (reapi.OutputFile(reapi.LAUNCHER_PATH, ln),)))
        self.client.put("ac", key, reapi.encode_action_result(ar))

    def contains_record(self, key: str) -> bool:
        return self.client.head("ac", key)

    def find_missing_records(self, keys: Iterable[str]) -> set[str]:
        keys = list(keys)
        return {k for k, there in zip(keys, self._map(self.contains_record, keys)) if not there}

    # ---- CAS ----

    def get_blob(self, digest: Digest) -> bytes | None:
        raw = self.client.get("cas", digest.hash)
        if raw is None:
            return None
        try:
            return check_content(raw, digest.hash, digest.size)
        except (BadBlob, SizeMismatch) as e:
            self._refuse(f"cas/{digest.hash}", raw, str(e))
            raise CorruptArtifactError(f"remote blob {self.name}/cas/{digest.hash}: {e}",
                                       digest=digest.hash, reason=str(e)) from None

    def put_blob(self, data: bytes) -> Digest:
        d = Digest.of(bytes(data))
        self.client.put("cas", d.hash, data)
        return d

    def contains_blob(self, digest: Digest) -> bool:
        return self.client.head("cas", digest.hash if isinstance(digest, Digest) else digest)

    def find_missing_blobs(self, digests: Iterable[Digest]) -> set[Digest]:
        digests = list(digests)
        return {d for d, there in zip(digests, self._map(self.contains_blob, digests)) if not there}

    def _map(self, fn, items: list) -> list:
        if len(items) <= 1:
            return [fn(x) for x in items]
        with ThreadPoolExecutor(max_workers=min(self.jobs, len(items)), thread_name_prefix="remote") as pool:
            return list(pool.map(fn, items))

    def close(self) -> None:
        self.client.close()
