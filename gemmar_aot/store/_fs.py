"""Filesystem primitives of the store: fanned-out paths, digest checks, temp-file debris.

Standard library only (the runtime imports this). Every file the store publishes goes
through :func:`gemmar_aot.util.atomic_write.atomic_write_bytes` (temp file in the final
directory, fsync, rename, fsync the directory), so a reader sees either nothing or the
whole file. Temp files start with "." and end in ".tmp"; every listing skips them and
``gc`` removes old ones (left by a killed writer).
"""

from __future__ import annotations

import contextlib
import os
import time
from collections.abc import Iterator
from pathlib import Path

from gemmar_aot.util.atomic_write import TMP_SUFFIX, atomic_write_bytes, file_mode, fsync_dir
from gemmar_aot.util.filedigest import is_hex64

__all__ = ["TMP_SUFFIX", "atomic_write_bytes", "check_hex64", "fanout", "file_mode", "fsync_dir", "iter_fanned",
           "iter_stray", "remove_stale_temps"]





def check_hex64(s: object, what: str) -> str:
    """``s`` if it is 64 lowercase hex digits (a sha256); else ValueError. Keeps paths inside the store."""
    if not is_hex64(s):
        raise ValueError(f"{what} must be 64 lowercase hex digits (a sha256), got {s!r}")
    return s  # type: ignore[return-value]


def fanout(base: Path, name: str, suffix: str) -> Path:
    """``base/ab/abcdef...<suffix>``: 256 subdirectories keep listings short."""
    return base / name[:2] / f"{name}{suffix}"


def iter_fanned(base: Path, suffix: str) -> Iterator[tuple[str, Path]]:
    """(name, path) of every published ``base/xx/<name><suffix>``, sorted; temp files skipped."""
    if not base.is_dir():
        return
    for sub in sorted(base.iterdir()):
        if len(sub.name) != 2 or not sub.is_dir():
            continue
        for p in sorted(sub.iterdir()):
            n = p.name
            if n.startswith(".") or not n.endswith(suffix):
                continue
            yield n[: -len(suffix)], p


def iter_stray(base: Path, suffix: str) -> Iterator[Path]:
    """Files under ``base/xx/`` that are neither published entries nor temp files."""
    if not base.is_dir():
        return
    for sub in sorted(base.iterdir()):
        if len(sub.name) != 2 or not sub.is_dir():
            yield sub
            continue
        for p in sorted(sub.iterdir()):
            n = p.name
            if n.startswith(".") and n.endswith(TMP_SUFFIX):
                continue
            if not n.endswith(suffix) or not is_hex64(n[: -len(suffix)]) or n[:2] != sub.name:
                yield p


def remove_stale_temps(base: Path, older_than_s: float, *, dry_run: bool = False) -> int:
    """Delete temp files under ``base`` (any depth) older than ``older_than_s``: debris of killed writers."""
    if not base.is_dir():
        return 0
    cutoff = time.time() - older_than_s
    n = 0
    for dirpath, _dirs, files in os.walk(base):
        for f in files:
            if f.startswith(".") and f.endswith(TMP_SUFFIX):
                p = os.path.join(dirpath, f)
                with contextlib.suppress(OSError):
                    if os.stat(p).st_mtime < cutoff:
                        if not dry_run:
                            os.unlink(p)
                        n += 1
    return n


def read_if_present(path: Path) -> bytes | None:
    """``path``'s bytes, or None when there is no such file (or a parent is not a directory)."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except (FileNotFoundError, NotADirectoryError):
        return None
