"""The zstd dictionaries of the local store directory: two copies of each (a blob and a spare
in ``dictionaries/``), the pointers naming the one new blobs and new records use, and the
re-encoding of blobs and records under a new one (``store.dictionaries.optimize``).

A mixin of :class:`~gemmar_aot.store.local.DirectoryBackend`: it uses the backend's paths,
codec, file writes and quarantine.
"""

from __future__ import annotations

import contextlib
import json
import os

from gemmar_aot.util.canonical_json import canonical_json_bytes as canonical_json
from gemmar_aot.util.filedigest import is_hex64

from . import blobfmt
from .backend import BadRecord
from .blob_codec import BadBlob, DictionaryUnavailable
from .store_errors import StoreError

#: zstd level for new records without a dictionary yet (cheap: a put is on the build's path).
RECORD_LEVEL = 3
#: Pointer files naming the dictionary new blobs / new records are compressed with.
DICT_POINTERS = {"blobs": "dictionary.json", "records": "record-dictionary.json"}


class DictionaryFiles:
    """The dictionary half of the directory backend (see the module docstring)."""


    def _load_dictionary(self, digest: str) -> bytes:
        """Verified raw bytes of dictionary ``digest``, from the blob or its spare copy.

        A damaged or missing copy is quarantined and rewritten from the good one, so one
        flipped byte in a dictionary costs nothing. Raises DictionaryUnavailable when
        neither copy is good.
        """
        problems = []
        good: bytes | None = None
        good_data: bytes | None = None
        bad_paths = []
        for p in (self.blob_path(digest), self.spare_path(digest)):
            try:
                data = p.read_bytes()
            except FileNotFoundError:
                problems.append(f"{p}: missing")
                bad_paths.append((p, None))
                continue
            try:
                raw = self.codec.decode_dictionary(data, digest)
            except BadBlob as e:
                problems.append(f"{p}: {e}")
                bad_paths.append((p, str(e)))
                continue
            good, good_data = raw, data
            break
        if good is None:
            for p, why in bad_paths:
                if why is not None:
                    self.quarantine(p, f"dictionary: {why}")
            raise DictionaryUnavailable(f"its zstd dictionary {digest} is missing or corrupt "
                                        f"({'; '.join(problems)})")
        if bad_paths and not self.readonly:
            for p, why in bad_paths:
                if why is not None:
                    self.quarantine(p, f"dictionary: {why}; restored from its other copy")
                with contextlib.suppress(OSError, StoreError):
                    self.write_file(p, good_data)
                    self.counters["dictionaries_restored"] += 1
        return good

    def dictionary_info(self, kind: str = "blobs") -> dict | None:
        """The dictionary new ``kind`` ("blobs" or "records") use: ``{"hash", "size", "trained_on", "level"}``
        (its Digest, then how it was trained)."""
        p = self.root / DICT_POINTERS[kind]
        try:
            info = json.loads(p.read_bytes())
        except FileNotFoundError:
            return None
        except ValueError:
            self.quarantine(p, "unreadable dictionary pointer")
            return None
        if self.awaits_migration():  # read as it is until its first write migrates it
            from .migrate import pointer_of_format3

            info = pointer_of_format3(info)
        if not isinstance(info, dict) or not is_hex64(info.get("hash")):
            self.quarantine(p, "malformed dictionary pointer")
            return None
        return info

    def current_dictionary(self, kind: str = "blobs") -> str | None:
        """Digest of the dictionary for new ``kind``, None for plain zstd (also when it is unusable)."""
        info = self.dictionary_info(kind)
        if info is None:
            return None
        try:
            self.codec.dictionary(info["hash"])
        except BadBlob:
            return None
        return info["hash"]

    def put_dictionary(self, raw: bytes) -> str:
        """Store a zstd dictionary as a plain blob plus its spare copy; returns its digest."""
        if raw[:4] != blobfmt.ZSTD_DICT_MAGIC:
            raise ValueError("not a zstd dictionary (bad magic)")
        d = self.put_blob(raw, use_dictionary=False).hash
        sp = self.spare_path(d)
        if not sp.is_file():
            self.write_file(sp, self.blob_path(d).read_bytes())
        return d

    def set_dictionary(self, raw: bytes | None, *, kind: str = "blobs", trained_on: int = 0) -> str | None:
        """Store ``raw`` (a zstd dictionary) and use it for new ``kind``; None: plain zstd."""
        self.init()
        p = self.root / DICT_POINTERS[kind]
        if raw is None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(p)
            return None
        d = self.put_dictionary(raw)
        self.write_file(p, canonical_json({"hash": d, "size": len(raw), "trained_on": trained_on,
                                           "level": self.level}))
        return d

    # ---- re-encoding under a new dictionary ----

    def reencode_blob(self, digest: str, *, dictionary: str | None, level: int | None = None,
                      only_if_smaller: bool = True) -> tuple[int, int] | None:
        """Re-encode blob ``digest`` with ``dictionary``; (bytes before, after) when rewritten."""
        p = self.blob_path(digest)
        try:
            data = p.read_bytes()
        except FileNotFoundError:
            return None
        try:
            raw = self.codec.decode(data, digest)
        except BadBlob as e:
            self.quarantine(p, str(e))
            return None
        if raw[:4] == blobfmt.ZSTD_DICT_MAGIC:
            return None  # dictionaries stay plain
        new = self.codec.encode(raw, dictionary, level=level, digest=digest)
        if only_if_smaller and len(new) >= len(data):
            return None
        self.write_file(p, new)
        return len(data), len(new)

    def reencode_record(self, key: str, dictionary: str | None) -> tuple[int, int] | None:
        """Re-encode record ``key`` with ``dictionary``; (bytes before, after) when it got smaller.
        The record's text is kept byte for byte (a record of an older schema stays one: only a
        migration or a build rewrites a record)."""
        p = self.record_path(key)
        try:
            data = p.read_bytes()
            text, _rec = self._decode_record(data, key)
        except FileNotFoundError:
            return None
        except (BadRecord, BadBlob) as e:
            self.quarantine(p, f"unreadable record: {e}")
            return None
        new = self.codec.encode(text, dictionary, level=self.level if dictionary else RECORD_LEVEL)
        if len(new) >= len(data):
            return None
        self.write_file(p, new)
        return len(data), len(new)
