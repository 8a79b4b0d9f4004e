"""Does a record say what its own blobs derive to?

A record's derived fields (kernel metadata, launch record) are a function of two blobs the
record names by digest: the code object and the launcher (:mod:`gemmar_aot.compiler.derive`).
Both blobs are verified by digest on every read, but the derived fields are only the
record's word. A record edited after it was derived -- two pointer arguments swapped, a grid
changed -- with every digest above it (record index, lock) made again to match, would pass
every hash check and be launched as it says. Deriving the record again from its own blobs
catches it with no compile: the derived fields must equal what this derive code makes of
those blobs, field by field.

Used by ``gemmar-aot verify`` (such a record is damage) and by the build (such a record is a
miss, never a hit). Only records made by this derive code are compared: a record of other
derive code is stale and derived again anyway (``derive.rederive``).

Not derive code (``keys.DERIVE_CODE``): a change here re-derives no record.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

from gemmar_aot.compiler.derive import DeriveError, derive, derive_key, derive_object, is_current, whole_object_arch
from gemmar_aot.model.types import Digest

#: The record members the derive step makes (besides its ``derive`` stamp).
DERIVED = ("metadata", "launch")
#: How many differing fields a finding names (the rest are counted).
SHOWN = 4


def differences(have: Any, want: Any, path: str = "") -> list[tuple[str, Any, Any]]:
    """Every leaf where ``have`` differs from ``want``: (dotted path, have, want)."""
    if isinstance(have, dict) and isinstance(want, dict):
        out = []
        for k in sorted(set(have) | set(want), key=str):
            out += differences(have.get(k, "<absent>"), want.get(k, "<absent>"), f"{path}.{k}" if path else str(k))
        return out
    if isinstance(have, list) and isinstance(want, list) and len(have) == len(want):
        out = []
        for i, (a, b) in enumerate(zip(have, want)):
            out += differences(a, b, f"{path}[{i}]")
        return out
    return [] if have == want else [(path, have, want)]


def derivation_problems(rec: Mapping[str, Any], code: bytes, launcher: bytes | None) -> list[str]:
    """How ``rec``'s derived fields differ from what this derive code makes of ``code`` and
    ``launcher`` (its own blobs; None for a code object loaded whole); empty when they agree."""
    try:
        want = _derive(rec, code, launcher)
    except DeriveError as e:
        return [f"its own blobs do not derive ({e})"]
    return _compare(rec, want, derive_key(Digest.of(code).hash, None if launcher is None else Digest.of(launcher).hash))


def _derive(rec: Mapping[str, Any], code: bytes, launcher: bytes | None) -> dict:
    arch = whole_object_arch(rec)
    return derive_object(code, arch) if launcher is None and arch is not None else derive(code, launcher)


def _compare(rec: Mapping[str, Any], want: Mapping[str, Any], key: str) -> list[str]:
    diff = [d for name in DERIVED if name in want and rec.get(name) != want[name]
            for d in differences(rec.get(name, "<absent>"), want[name], name)]
    stamp = (rec.get("derive") or {}).get("key")
    if stamp != key:
        diff.append(("derive.key", stamp, key))
    shown = [f"{p} is {_short(a)}, its blobs derive {_short(b)}" for p, a, b in diff[:SHOWN]]
    if len(diff) > SHOWN:
        shown.append(f"and {len(diff) - SHOWN} more field(s)")
    return shown


def _short(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 60 else text[:57] + "..."


def kernel_label(rec: Mapping[str, Any]) -> str:
    """``recipe:kind:rRANK`` of a record's spec, for messages."""
    spec = rec.get("spec") if isinstance(rec.get("spec"), Mapping) else {}
    return f"{spec.get('recipe', '?')}:{spec.get('kind', '?')}:r{spec.get('rank', '?')}"


class RecordCheck:
    """``record_problem`` over many records: each (code object, launcher) pair is loaded and
    derived once, however many records name it (a store's action cache and its locks' record
    indexes name the same records)."""

    def __init__(self) -> None:
        self._derived: dict[tuple[str, str], tuple[dict, str] | str] = {}

    def __call__(self, rec: Mapping[str, Any], load: Callable[[Digest], bytes | None]) -> str | None:
        """Why ``rec`` contradicts its own blobs, or None: it agrees, or it cannot be compared
        (made by other derive code: stale, derived again by the next build; no launcher, or a
        blob ``load`` does not have: the store's own checks report those). ``load(digest)``
        returns the verified bytes, or None when absent."""
        from gemmar_aot.store.backend import record_blob, record_launcher

        if not is_current(rec):
            return None
        ln = record_launcher(rec)
        if ln is None and whole_object_arch(rec) is None:
            return None
        blob = record_blob(rec)
        pair = (blob.hash, ln.hash if ln is not None else whole_object_arch(rec))
        got = self._derived.get(pair)
        if got is None:
            code, launcher = load(blob), (load(ln) if ln is not None else None)
            if code is None or (ln is not None and launcher is None):
                return None
            try:
                got = (_derive(rec, code, launcher), derive_key(blob.hash, None if ln is None else ln.hash))
            except DeriveError as e:
                got = f"its own blobs do not derive ({e})"
            self._derived[pair] = got
        found = [got] if isinstance(got, str) else _compare(rec, *got)
        if not found:
            return None
        return (f"{kernel_label(rec)}: the record contradicts its own blobs: " + "; ".join(found)
                + ". It was edited after it was derived (or derived by a broken derive code)")


def record_problem(rec: Mapping[str, Any], load: Callable[[Digest], bytes | None]) -> str | None:
    """:class:`RecordCheck` for one record."""
    return RecordCheck()(rec, load)
