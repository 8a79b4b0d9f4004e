"""Editing a lock's document (``Lock.to_json``'s form, schema 3) in tests: a rank's launches
live in that rank's part, by tuple index, beside the rank's kernels. These helpers keep an
edited document consistent where the test means it to be, so the refusal a test asserts is
the one it set up."""

from __future__ import annotations

import json
from pathlib import Path

from gemmar_aot.model.lock_codec import LOCK_ZSTD_MAGIC, decompress_lock, encode_lock_doc


def decode_lock_doc(data: bytes) -> dict:
    """The document of a lock file's bytes (plain or zstd), parts inline: what ``encode_lock_doc``
    encoded. Unchecked, for tests that look inside or edit it; ``Lock.from_bytes`` is the one
    reader of a lock, and checks it."""
    if data[:4] == LOCK_ZSTD_MAGIC:
        data = decompress_lock(data, "<lock>")
    head, *parts = (json.loads(line) for line in data.split(b"\n") if line)
    return {**head, "parts": parts}


def read_doc(path: Path) -> dict:
    return decode_lock_doc(Path(path).read_bytes())


def write_doc(path: Path, doc: dict) -> None:
    Path(path).write_bytes(encode_lock_doc(doc))


def part(doc: dict, rank: int) -> dict:
    return next(p for p in doc["parts"] if p["rank"] == rank)


def rank_launches(doc: dict, ti: int, rank: int) -> dict:
    """{"rank", "launches", "self_test"} of tuple ``ti`` and ``rank``; the lists are the document's."""
    item = next(x for x in part(doc, rank)["launches"] if x[0] == ti)
    return {"rank": rank, "launches": item[1], "self_test": item[2]}


def kernel_entry(doc: dict, key: str) -> dict:
    """The kernel entry of ``key``, one object shared by every part that holds it (an edit reaches all)."""
    holders = [p for p in doc["parts"] if key in p["kernels"]]
    k = holders[0]["kernels"][key]
    for p in holders:
        p["kernels"][key] = k
    return k


def drop_rank(doc: dict, ti: int, rank: int) -> None:
    """Tuple ``ti`` no longer built for ``rank`` (its part loses that tuple; an empty part goes)."""
    doc["tuples"][ti]["ranks"].remove(rank)
    p = part(doc, rank)
    p["launches"] = [x for x in p["launches"] if x[0] != ti]
    if not p["launches"]:
        doc["parts"].remove(p)


def keep_tuples(doc: dict, keep) -> None:
    """Only the tuples for which ``keep(tuple_json)`` holds, the parts renumbered to match."""
    new_index = {}
    tuples = []
    for i, t in enumerate(doc["tuples"]):
        if keep(t):
            new_index[i] = len(tuples)
            tuples.append(t)
    for i in range(len(doc.get("ep", ()))):  # a part's launch items index the tuples, then the EP entries
        new_index[len(doc["tuples"]) + i] = len(tuples) + i
    doc["tuples"] = tuples
    for p in doc["parts"]:
        p["launches"] = [[new_index[x[0]], x[1], x[2]] for x in p["launches"] if x[0] in new_index]
    doc["parts"] = [p for p in doc["parts"] if p["launches"]]
