"""Atomic directory installs and the setup lock (a crash never leaves a half-written output; files are
written by :mod:`gemmar_aot.util.atomic_write`)."""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

from gemmar_aot.util.atomic_write import fsync_dir as _fsync_dir


@contextlib.contextmanager
def staging_dir(target: Path) -> Iterator[Path]:
    """Yield an empty directory next to ``target``; on success it replaces
    ``target`` (the old one is removed), on error it is deleted."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".staging", dir=target.parent))
    os.chmod(tmp, 0o755)  # mkdtemp makes it 0700
    try:
        yield tmp
        if target.exists() or target.is_symlink():
            old = target.with_name(f".{target.name}.old.{os.getpid()}")
            os.replace(target, old)
            os.replace(tmp, target)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, target)
        _fsync_dir(target.parent)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """Exclusive advisory lock: two concurrent setups run one after the other."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        fcntl.flock(f.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f.fileno(), fcntl.LOCK_UN)
