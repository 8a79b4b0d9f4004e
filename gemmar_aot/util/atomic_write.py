"""The one atomic file writer: temp file in the target directory, fsync, rename, fsync the directory.

Standard library only (the runtime imports it). A reader sees either the old file or the
whole new one, never a torn write -- also on NFS, where a rename within a directory is
atomic -- and after a crash the file is either there entirely or not at all. Temp files
are named ``.<name>.<random>.tmp`` so listings can skip them and a cleaner can remove the
debris of a killed writer (see :data:`TMP_SUFFIX`).
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from pathlib import Path

#: Every temp file this writer creates ends in this (and starts with ".").
TMP_SUFFIX = ".tmp"

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


def fsync_dir(d: Path) -> None:
    """fsync a directory (makes a rename in it durable); a no-op where that is not possible."""
    with contextlib.suppress(OSError):
        fd = os.open(d, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0))
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write_bytes(path: str | os.PathLike, data: bytes, *, durable: bool = True,
                       mode: int | None = None) -> None:
    """Publish ``data`` at ``path``: temp file in the same directory, fsync, rename, fsync the dir.

    Creates missing parent directories. ``durable=False`` skips the fsyncs (still atomic
    for readers; not crash-durable). ``mode``: the file's permissions (default: 0666 minus
    the umask). On any error the temp file is removed and ``path`` is untouched.
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


def atomic_write_text(path: str | os.PathLike, text: str, *, durable: bool = True, mode: int | None = None) -> None:
    """:func:`atomic_write_bytes` of ``text`` encoded as UTF-8."""
    atomic_write_bytes(path, text.encode(), durable=durable, mode=mode)
