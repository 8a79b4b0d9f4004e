"""The bytes of a blob file: one zstd frame, optionally preceded by a dictionary reference.

A blob file is exactly one of:

- a plain zstd frame (content size and checksum recorded) -- ``zstd -d`` decodes it;
- a zstd *skippable frame* naming the dictionary by sha256, followed by a zstd frame
  compressed with that dictionary -- ``zstd -d -D <dictionary>`` decodes it (zstd skips
  skippable frames by definition).

The reference frame is 44 bytes: magic 0x184D2A5A (LE), payload length 36 (LE u32),
b"GAD1", the dictionary's raw 32-byte sha256. The dictionary is itself a blob of the
store (plain zstd), so every blob is decodable from the store alone and every byte
that goes into decoding it is verified against a digest.

The digest of a blob is the sha256 of the decoded bytes, never of the file: re-encoding
a blob (new level or dictionary) changes the file, not its name or its records.
"""

from __future__ import annotations

import struct
import threading

import zstandard

_SKIPPABLE_MIN = 0x184D2A50
_SKIPPABLE_MAX = 0x184D2A5F
DICT_REF_MAGIC = struct.pack("<I", 0x184D2A5A)
DICT_REF_TAG = b"GAD1"
DICT_REF_LEN = 8 + 4 + 32
#: First bytes of a zstd dictionary (ZDICT magic).
ZSTD_DICT_MAGIC = struct.pack("<I", 0xEC30A437)
#: Largest blob the store decodes (a code object is tens of KB; this guards against bombs).
MAX_BLOB_BYTES = 1 << 30
#: How many leading bytes ``peek`` needs: reference frame + the largest zstd frame header.
PEEK_BYTES = DICT_REF_LEN + 18


class BlobFormatError(ValueError):
    """The file is not a blob this version understands."""


def dict_ref_frame(dict_digest: str) -> bytes:
    return DICT_REF_MAGIC + struct.pack("<I", 4 + 32) + DICT_REF_TAG + bytes.fromhex(dict_digest)


def split(data: bytes) -> tuple[str | None, bytes]:
    """(dictionary digest or None, the zstd frame)."""
    if len(data) >= 4:
        (magic,) = struct.unpack_from("<I", data, 0)
        if _SKIPPABLE_MIN <= magic <= _SKIPPABLE_MAX:
            if data[:4] != DICT_REF_MAGIC or len(data) < DICT_REF_LEN:
                raise BlobFormatError("starts with an unknown zstd skippable frame")
            (n,) = struct.unpack_from("<I", data, 4)
            if n != 36 or data[8:12] != DICT_REF_TAG:
                raise BlobFormatError("malformed dictionary reference frame")
            return data[12:44].hex(), data[44:]
    return None, data


def peek(prefix: bytes) -> tuple[str | None, int | None]:
    """(dictionary digest, decoded size) from the first ``PEEK_BYTES`` of a blob file.

    Cheap (no decompression): used by stats and gc. Raises BlobFormatError.
    """
    dict_digest, frame = split(prefix)
    try:
        size = zstandard.frame_content_size(frame)
    except zstandard.ZstdError as e:
        raise BlobFormatError(f"bad zstd frame header: {e}") from None
    return dict_digest, (None if size < 0 else size)


def encode(raw: bytes, cctx: zstandard.ZstdCompressor, dict_digest: str | None) -> bytes:
    frame = cctx.compress(raw)
    return frame if dict_digest is None else dict_ref_frame(dict_digest) + frame


def decode_frame(frame: bytes, dctx: zstandard.ZstdDecompressor, expected_size: int | None) -> bytes:
    """Decompress one frame; raises BlobFormatError. Does NOT check the digest (the caller does)."""
    try:
        size = zstandard.frame_content_size(frame)
    except zstandard.ZstdError as e:
        raise BlobFormatError(f"bad zstd frame header: {e}") from None
    if size < 0:
        raise BlobFormatError("zstd frame does not record its content size")
    if expected_size is not None and size != expected_size:
        raise BlobFormatError(f"frame holds {size} bytes, expected {expected_size}")
    if size > MAX_BLOB_BYTES:
        raise BlobFormatError(f"frame claims {size} bytes (limit {MAX_BLOB_BYTES})")
    try:
        return dctx.decompress(frame, max_output_size=size, allow_extra_data=False)
    except zstandard.ZstdError as e:
        raise BlobFormatError(f"zstd cannot decode it: {e}") from None


def compressor(level: int, dictionary: zstandard.ZstdCompressionDict | None = None) -> zstandard.ZstdCompressor:
    return zstandard.ZstdCompressor(level=level, dict_data=dictionary, write_checksum=True,
                                    write_content_size=True, write_dict_id=True)


class FrameError(BlobFormatError):
    """A frame :func:`checked_frame` refuses; ``kind`` says why: ``"unchecked"`` (no checksum, or no
    plausible content size), ``"truncated"``, or ``"damaged"`` (zstd cannot decode it: ``detail``)."""

    def __init__(self, kind: str, detail: str = ""):
        super().__init__(kind if not detail else f"{kind}: {detail}")
        self.kind, self.detail = kind, detail


def checked_frame(data: bytes, max_size: int) -> tuple[bytes, bytes]:
    """The first zstd frame of ``data``, decompressed, and the bytes after it (the files beside a
    lock are frames back to back). The frame must carry its checksum and a content size in
    ``(0, max_size]``, and decode to exactly that size. Raises :class:`FrameError`.

    The frame is found by walking its block headers (:func:`frame_size`) and decoded alone, in
    one call, by this thread's decompressor: the streaming decoder and a new decompressor per
    frame took several times as long (rank 0's 624 KB of code objects: 0.45 against 0.09 ms; an
    index header: 60 against ~7 us). Nothing is taken from the walk on trust: the bytes it names
    must decode as exactly one frame, else (a truncated or damaged frame) the streaming decoder
    reads ``data`` as before and says which it is."""
    try:
        params = zstandard.get_frame_parameters(data)
        if (not params.has_checksum or params.content_size in (0, zstandard.CONTENTSIZE_UNKNOWN)
                or params.content_size > max_size):
            raise FrameError("unchecked")
        dctx = plain_decompressor()
        size = frame_size(data)
        if size is not None:
            try:  # libzstd checks the checksum, the content size, and that nothing follows
                text = dctx.decompress(data if size == len(data) else data[:size], allow_extra_data=False)
            except zstandard.ZstdError:
                pass
            else:
                if len(text) == params.content_size:
                    return text, data[size:]
        dobj = dctx.decompressobj()
        text = dobj.decompress(data)
        if not dobj.eof or len(text) != params.content_size:
            raise FrameError("truncated")
    except zstandard.ZstdError as exc:
        raise FrameError("damaged", str(exc)) from None
    return text, dobj.unused_data


def frame_size(data: bytes) -> int | None:
    """How many bytes the zstd frame at the start of ``data`` takes, from its header and its
    blocks' headers (RFC 8878, 3.1.1): None when they do not add up. A hint only: the caller
    decodes exactly these bytes, which libzstd refuses unless they are one whole frame."""
    try:
        pos = zstandard.frame_header_size(data)
    except zstandard.ZstdError:
        return None
    checksum = 4 if len(data) > 4 and data[4] & 0x04 else 0  # Content_Checksum_flag
    n = len(data)
    while pos + 3 <= n:
        h = data[pos] | data[pos + 1] << 8 | data[pos + 2] << 16
        last, kind, size = h & 1, (h >> 1) & 3, h >> 3
        if kind == 3:  # reserved
            return None
        pos += 3 + (1 if kind == 1 else size)  # an RLE block holds one byte, repeated
        if last:
            return pos + checksum if pos + checksum <= n else None
    return None


_TLS = threading.local()


def plain_decompressor() -> zstandard.ZstdDecompressor:
    """This thread's decompressor without a dictionary, for every reader of plain frames (the
    store's codec too): making one costs ~20 us, more than decoding an index header, and an
    instance must not be used by two threads at once."""
    d = getattr(_TLS, "dctx", None)
    if d is None:
        d = _TLS.dctx = zstandard.ZstdDecompressor()
    return d
