"""How a build finds its kernels in its own store, each blob read once.

A record found under its action key is a hit only when its code object is there and verifies
and its derived fields are what its own blobs derive (``compiler.derive_check``); a record of
other derive code is derived again and written back (``compiler.derive.rederive``); a record
its blobs contradict is quarantined and compiled again, never a hit; a kernel whose key only
changed form (key schema 3) is taken over under its key now. Every blob is read from the store
and verified once (:meth:`LocalLookup.load_blob`): the look-up, the derive check, the lock's
blob index and the wheel share the bytes.
"""

from __future__ import annotations

from typing import Any, Callable

from gemmar_aot.compiler.derive import DeriveError, is_current, rederive
from gemmar_aot.compiler.derive_check import RecordCheck
from gemmar_aot.store.backend import record_blob
from gemmar_aot.store.store_errors import BlobNotFoundError, CorruptArtifactError


class LocalLookup:
    """One build's reads of its store (``st``, at ``root``): :meth:`find` each kernel's record,
    :meth:`load_blob` each blob. What it saw: ``rederived`` and ``relabelled`` (action keys),
    ``contradicted`` (key and problem), ``blobs`` (digest -> verified bytes)."""

    def __init__(self, st: Any, root: Any):
        self.st, self.root = st, root
        self.blobs: dict[str, bytes] = {}
        self.rederived: list[str] = []
        self.relabelled: list[str] = []  # taken over from key schema 3 (keys.schema3_key)
        self.contradicted: list[dict] = []  # records their own blobs contradict: compiled again
        self._check = RecordCheck()
        self._rewriter = None

    def load_blob(self, digest: str, size: int | None = None) -> bytes:
        """The verified bytes of blob ``digest`` from the store, read once per build."""
        got = self.blobs.get(digest)
        if got is None or (size is not None and len(got) != size):  # (another size: the store says what is wrong)
            got = self.blobs[digest] = self.st.load_blob(digest, size)
        return got

    def find(self, key: str, spec: Any, old_key: Callable[[], str | None]) -> dict | None:
        """The hit for action ``key`` (whose spec is ``spec``), or None: a miss. ``old_key()``: the
        kernel's key schema 3 key, asked only when ``key`` has no record."""
        rec = self._record(key)
        relabel = rec is None
        if relabel:
            rec = self._relabel(key, spec, old_key())
        if rec is None:
            return None
        if is_current(rec):
            return self._unless_contradicted(key, rec)
        if self._rewriter is None:
            from gemmar_aot.builder.remote_session import FETCH_LEVEL
            from gemmar_aot.store import Store

            # Written as the remote's entries are (remote_session.py): zstd level 3, no fsync. A
            # torn or lost record is derived again by the next build, and ``gemmar-aot optimize``
            # (run by every build that compiles) re-encodes it.
            self._rewriter = Store(self.root, level=FETCH_LEVEL, durable=False, touch=False)
        try:
            rec = rederive(self, key, rec, writer=self._rewriter)  # its blobs through load_blob: read once
        except DeriveError:
            return None  # blobs this derive code refuses: compiled again
        if rec is not None:
            (self.relabelled if relabel else self.rederived).append(key)
        return rec

    def _record(self, key: str) -> dict | None:
        """The store's record under ``key`` when its code object is there and verifies; else None
        (a damaged blob is quarantined by the store)."""
        rec = self.st.read_record_file(key)
        if rec is not None:
            d = record_blob(rec)
            try:
                self.load_blob(d.hash, d.size)
            except (BlobNotFoundError, CorruptArtifactError):
                return None
        return rec

    def _unless_contradicted(self, key: str, rec: dict) -> dict | None:
        """``rec``, or None when it contradicts its own blobs (``derive_check``): then it is
        quarantined, said, and compiled again -- never a hit."""
        def load(d):
            try:
                return self.load_blob(d.hash, d.size)
            except (BlobNotFoundError, CorruptArtifactError):
                return None

        why = self._check(rec, load)
        if why is None:
            return rec
        self.st.quarantine(self.st.record_path(key), why)
        self.contradicted.append({"key": key, "problem": why})
        return None

    def _relabel(self, key: str, spec: Any, old_key: str | None) -> dict | None:
        """The record under the kernel's key schema 3 key, taken over under ``key`` (the same spec,
        toolchain and compile code: only the key's form moved; its blobs are verified when it is
        derived again, next), or None."""
        old = self.st.get_record(old_key) if old_key is not None else None
        if old is None or old.get("spec") != spec:
            return None
        # derived again (and written under the new key) as any record of other derive code is
        return {**old, "key": key, "derive": {**old.get("derive", {}), "code": None}}
