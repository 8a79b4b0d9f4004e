"""The one decode-and-verify path for blobs (and the matching encoder).

Every reader of blob bytes -- the local store, the wheel's pack file, a remote backend,
``verify``, ``export``/``import`` -- turns stored bytes into content through
:class:`BlobCodec`, so "what counts as a good blob" is defined once:

- the bytes parse as a blob file (:mod:`.blobfmt`: an optional dictionary reference, one
  zstd frame recording its content size, at most ``MAX_BLOB_BYTES``);
- the dictionary it names is itself a verified blob (fetched through the codec's
  ``load_dictionary``, never trusted by name);
- the decoded bytes have the sha256 the caller asked for, and the size when one is given.

A remote backend that moves plain bytes (Bazel's ``/cas/``) checks them with
:func:`check_content`, the same digest rule without the zstd layer.

Runtime-safe: standard library + ``zstandard``.
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import zstandard

from . import blobfmt
from gemmar_aot.util.filedigest import sha256_hex


class BadBlob(Exception):
    """Stored bytes are not the blob they claim to be. ``str(e)`` is the reason."""


class SizeMismatch(Exception):
    """A good blob, but not the size the caller (a record or a lock) names: the caller is wrong."""


class DictionaryUnavailable(BadBlob):
    """The dictionary a blob names is missing or corrupt (every copy of it)."""


def check_content(raw: bytes, digest: str, size: int | None = None) -> bytes:
    """``raw`` if its sha256 is ``digest`` (and its length ``size`` when given).

    Raises BadBlob (the bytes are wrong) or SizeMismatch (the caller's size is wrong).
    """
    got = sha256_hex(raw)
    if got != digest:
        raise BadBlob(f"content sha256 is {got}, expected {digest}")
    if size is not None and len(raw) != size:
        raise SizeMismatch(f"blob {digest} holds {len(raw)} bytes, the caller expected {size}")
    return raw


class BlobCodec:
    """Encode and decode blob files; dictionaries come from ``load_dictionary(digest)``.

    ``load_dictionary`` returns the dictionary's *verified* raw bytes (normally by calling
    :meth:`decode_dictionary` on its stored bytes) or raises :class:`DictionaryUnavailable`.
    Digested dictionaries and compressors are cached; :meth:`forget` drops one (after
    its file was quarantined). Thread-safe.
    """

    def __init__(self, load_dictionary: Callable[[str], bytes] | None = None, *, level: int = 19):
        self._load_dictionary = load_dictionary
        self.level = level
        self._lock = threading.Lock()
        self._dicts: dict[str, zstandard.ZstdCompressionDict] = {}
        # Compressors per thread: a ZstdCompressor must not run in two threads at once
        # (it corrupts frames or crashes). ``_generation`` moves on every ``forget`` so no
        # thread keeps compressing with a dictionary that was dropped.
        self._tls = threading.local()
        self._generation = 0

    # ---- dictionaries ----

    def dictionary(self, digest: str) -> zstandard.ZstdCompressionDict:
        """The digested dictionary ``digest``; raises DictionaryUnavailable."""
        with self._lock:
            d = self._dicts.get(digest)
        if d is not None:
            return d
        if self._load_dictionary is None:
            raise DictionaryUnavailable(f"its zstd dictionary {digest} is not available here")
        raw = self._load_dictionary(digest)
        d = zstandard.ZstdCompressionDict(raw)
        with self._lock:
            self._dicts[digest] = d
        return d

    def add_dictionary(self, raw: bytes) -> str:
        """Make a verified in-memory dictionary available (e.g. one just trained); returns its digest."""
        digest = sha256_hex(raw)
        with self._lock:
            self._dicts.setdefault(digest, zstandard.ZstdCompressionDict(raw))
        return digest

    def forget(self, digest: str) -> None:
        with self._lock:
            self._dicts.pop(digest, None)
            self._generation += 1

    def decode_dictionary(self, data: bytes, digest: str) -> bytes:
        """Verified raw bytes of a stored dictionary (a plain zstd blob); raises BadBlob."""
        try:
            needs = blobfmt.split(data)[0]
        except blobfmt.BlobFormatError as e:
            raise BadBlob(str(e)) from None
        if needs is not None:
            raise BadBlob("a dictionary must not itself need a dictionary")
        raw = self.decode(data, digest)
        if raw[:4] != blobfmt.ZSTD_DICT_MAGIC:
            raise BadBlob("not a zstd dictionary (bad magic)")
        return raw

    # ---- decode ----

    def decode(self, data: bytes, digest: str, size: int | None = None) -> bytes:
        """The verified content of the stored bytes ``data`` of blob ``digest``.

        Raises BadBlob (including DictionaryUnavailable) or SizeMismatch; never returns
        bytes that are not what ``digest`` names.
        """
        try:
            dict_digest, frame = blobfmt.split(data)
            raw = blobfmt.decode_frame(frame, self.decompressor(dict_digest), None)
        except blobfmt.BlobFormatError as e:
            raise BadBlob(str(e)) from None
        except DictionaryUnavailable as e:
            raise DictionaryUnavailable(str(e)) from None
        return check_content(raw, digest, size)

    def decode_frame_only(self, data: bytes) -> bytes:
        """Decode stored bytes without a digest to check (records: their zstd checksum guards them)."""
        try:
            dict_digest, frame = blobfmt.split(data)
            return blobfmt.decode_frame(frame, self.decompressor(dict_digest), None)
        except blobfmt.BlobFormatError as e:
            raise BadBlob(str(e)) from None

    def decompressor(self, dict_digest: str | None) -> zstandard.ZstdDecompressor:
        """This thread's decompressor for ``dict_digest`` (None: no dictionary); raises
        DictionaryUnavailable. Kept per thread like the compressors: a new one per blob sets
        the dictionary's context up again, which costs more than decompressing a typical code
        object."""
        if dict_digest is None:
            return blobfmt.plain_decompressor()
        tls = self._tls
        if getattr(tls, "dgeneration", None) != self._generation:
            tls.dgeneration, tls.dctx = self._generation, {}
        d = tls.dctx.get(dict_digest)
        if d is None:
            d = tls.dctx[dict_digest] = zstandard.ZstdDecompressor(dict_data=self.dictionary(dict_digest))
        return d

    # ---- encode ----

    def compressor(self, dict_digest: str | None, level: int | None = None) -> zstandard.ZstdCompressor:
        k = (self.level if level is None else level, dict_digest)
        tls = self._tls
        if getattr(tls, "generation", None) != self._generation:
            tls.generation, tls.cctx = self._generation, {}
        c = tls.cctx.get(k)
        if c is None:
            c = tls.cctx[k] = blobfmt.compressor(k[0], self.dictionary(dict_digest) if dict_digest else None)
        return c

    def encode(self, raw: bytes, dict_digest: str | None, *, level: int | None = None,
               digest: str | None = None) -> bytes:
        """Stored bytes for ``raw``; with ``digest``, checked to decode back to it first."""
        data = blobfmt.encode(raw, self.compressor(dict_digest, level), dict_digest)
        if digest is not None:
            try:
                self.decode(data, digest, len(raw))
            except (BadBlob, SizeMismatch) as e:  # pragma: no cover - a zstd or memory fault
                raise RuntimeError(f"zstd round trip of blob {digest} failed ({e})") from None
        return data
