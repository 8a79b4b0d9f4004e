"""A record index file taken apart and put back with zstd alone, not with the reader under test
(gemmar_aot.store.record_index), for tests that damage or rewrite one line of it."""

from __future__ import annotations

import json
from pathlib import Path

import zstandard

from gemmar_aot.model.spec import canonical_json


def read_frames(path: Path) -> tuple[dict, list[list[bytes]]]:
    """(header, the lines of each group) of a schema-2 index file."""
    obj = zstandard.ZstdDecompressor().decompressobj()
    head = json.loads(obj.decompress(Path(path).read_bytes()))
    rest, groups = obj.unused_data, []
    for nbytes, _prefixes in head["groups"]:
        groups.append(zstandard.ZstdDecompressor().decompress(rest[:nbytes]).split(b"\n"))
        rest = rest[nbytes:]
    assert rest == b""
    return head, groups


def write_frames(path: Path, head: dict, groups: list[list[bytes]]) -> None:
    """Write ``groups`` back under ``head``, its frame sizes updated (its key prefixes kept)."""
    cctx = zstandard.ZstdCompressor(write_checksum=True, write_content_size=True)
    frames = [cctx.compress(b"\n".join(lines)) for lines in groups]
    head = {**head, "groups": [[len(f), p] for f, (_n, p) in zip(frames, head["groups"])]}
    Path(path).write_bytes(cctx.compress(canonical_json(head).encode()) + b"".join(frames))


def find_line(head: dict, groups: list[list[bytes]], key: str) -> tuple[int, int]:
    """(group, line) of action key ``key``."""
    n = head["prefix_hex"]
    return next((g, i) for g, lines in enumerate(groups) for i, line in enumerate(lines)
                if line[:n] == key[:n].encode())
