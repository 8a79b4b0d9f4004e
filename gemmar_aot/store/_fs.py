"""Filesystem primitives of the store: atomic writes, fanned-out paths, digest checks.

Standard library only (the runtime imports this). Every file the store publishes is
written to a temp file in its final directory, fsynced, renamed over the final name and
the directory fsynced, so a reader sees either nothing or the whole file -- also on NFS,
where rename within a directory is atomic. Temp files start with "." and end in ".tmp";
every listing skips them and ``gc`` removes old ones (left by a killed writer).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

_HEX64 = re.compile(r"[0-9a-f]{64}")

_FILE_MODE: int | None = None


def file_mode() -> int:
    """0666 minus the process umask, for published files (a group-shared store stays group-
    writable when the umask allows it). Read from /proc when possible: setting the umask to
    read it would race with other threads creating files."""
    global _FILE_MODE
    if _FILE_MODE is None:
        umask = None
        with contextlib.suppress(OSError, ValueError):
            for line in Path("/proc/self/status").read_text().splitlines():
                if line.startswith("Umask:"):
                    umask = int(line.split()[1], 8)
        if umask is None:
            umask = os.umask(0o022)
            os.umask(umask)
        _FILE_MODE = 0o666 & ~umask
    return _FILE_MODE

TMP_SUFFIX = ".tmp"


def is_hex64(s: object) -> bool:
    return isinstance(s, str) and _HEX64.fullmatch(s) is not None


def check_hex64(s: object, what: str) -> str:
    """``s`` if it is 64 lowercase hex digits (a sha256); else ValueError. Keeps paths inside the store."""
    if not is_hex64(s):
        raise ValueError(f"{what} must be 64 lowercase hex digits (a sha256), got {s!r}")
    return s  # type: ignore[return-value]


def sha256_hex(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def fanout(base: Path, name: str, suffix: str) -> Path:
    """``base/ab/abcdef...<suffix>``: 256 subdirectories keep listings short."""
    return base / name[:2] / f"{name}{suffix}"


def fsync_dir(d: Path) -> None:
    with contextlib.suppress(OSError):
        fd = os.open(d, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_bytes(path: Path, data: bytes, *, durable: bool = True, mode: int | None = None) -> None:
    """Publish ``data`` at ``path``: temp file in the same directory, fsync, rename, fsync the dir.

    ``durable=False`` skips the fsyncs (still atomic for readers; not crash-durable).
    ``mode``: the file's permissions (default: 0666 minus the umask).
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.chmod(tmp, file_mode() if mode is None else mode)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if durable:
        fsync_dir(path.parent)


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
