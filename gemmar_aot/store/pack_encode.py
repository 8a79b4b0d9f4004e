"""Encoding blobs into a pack (:mod:`.pack`) with a dictionary trained on them: what an artifact
wheel ships (``gemmar_aot.package``) and a manifest's closure in the remote cache
(``gemmar_aot.builder.closure``). Build side: it trains dictionaries (:mod:`.dictionaries`), which the pack
reader never needs."""

from __future__ import annotations

from collections.abc import Mapping

import zstandard

from . import blobfmt
from .dictionaries import train_best_dictionary
from .pack import PackBackend, write_pack
from gemmar_aot.util.filedigest import sha256_hex


def encode_blobs(raws: Mapping[str, bytes], level: int) -> tuple[dict[str, bytes], dict]:
    """Canonical blob-file bytes of ``raws`` (digest -> raw) at zstd ``level`` with a dictionary
    trained on them: {digest: file bytes} (the dictionary included) and the encoding facts.
    Deterministic for a given libzstd."""
    samples = [raws[d] for d in sorted(raws)]
    dict_raw, report = train_best_dictionary(samples) if samples else (None, {})
    files: dict[str, bytes] = {}
    dict_digest = None
    if dict_raw is not None:
        dict_digest = sha256_hex(dict_raw)
        files[dict_digest] = blobfmt.encode(dict_raw, blobfmt.compressor(level), None)
        cctx = blobfmt.compressor(level, zstandard.ZstdCompressionDict(dict_raw))
    else:
        cctx = blobfmt.compressor(level)
    for d in sorted(raws):
        files[d] = blobfmt.encode(raws[d], cctx, dict_digest)
    return files, {
        "zstd_level": level,
        "dictionary": dict_digest,
        "dictionary_bytes": 0 if dict_raw is None else len(dict_raw),
        "dictionary_gain_vs_plain": report.get("gain_vs_plain"),
        "python_zstandard": zstandard.__version__,
        "libzstd": ".".join(map(str, zstandard.ZSTD_VERSION)),
    }


def pack_closure(raws: Mapping[str, bytes], extra: Mapping[str, bytes], level: int = 19, *,
                 launchers: Mapping[str, bytes] | None = None) -> bytes:
    """A closure's pack (``gemmar_aot.builder.closure``): the code objects ``raws`` (digest -> raw) with a
    dictionary trained on them, the ``launchers`` (digest -> raw) with one of their own (MLIR text
    shares little with ELF), and ``extra`` (digest -> raw: the lock, its record index) without
    one; each read back and checked before the pack is returned."""
    files, _encoding = encode_blobs(raws, level)
    launchers = {d: b for d, b in (launchers or {}).items() if d not in files}
    files.update(encode_blobs(launchers, level)[0])
    plain = blobfmt.compressor(level)
    for d, data in extra.items():
        files[d] = blobfmt.encode(data, plain, None)
    pack = write_pack({d: [data] for d, data in files.items()})
    reader = PackBackend(".", data=pack, where="<closure pack>")
    for d, data in (*raws.items(), *launchers.items(), *extra.items()):
        reader.load_blob(d, len(data))
    return pack
