"""sha256 digests of files and of trees of files. Standard library only, so both the
build side (the toolchain) and the runtime (the pod's mori check) use the same ones."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from pathlib import Path

_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's content."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def iter_files(base: Path, keep: Callable[[str], bool] | None = None) -> list[str]:
    """Sorted POSIX paths (relative to ``base``) of the regular files under it.
    Symlinks are recorded by the file they point at."""
    base = Path(base)
    out = []
    for p in base.rglob("*"):
        if p.is_file():
            rel = p.relative_to(base).as_posix()
            if keep is None or keep(rel):
                out.append(rel)
    out.sort()
    return out


def tree_digest(base: Path, rel_paths: Iterable[str] | None = None) -> str:
    """Digest over sorted relative paths and file contents.

    For each file, in sorted order: ``path NUL size NUL content``. Independent of
    where ``base`` is and of timestamps/permissions.
    """
    base = Path(base)
    rels = sorted(rel_paths) if rel_paths is not None else iter_files(base)
    h = hashlib.sha256()
    for rel in rels:
        p = base / rel
        size = p.stat().st_size
        h.update(f"{rel}\0{size}\0".encode())
        with open(p, "rb") as f:
            while chunk := f.read(_CHUNK):
                h.update(chunk)
    return h.hexdigest()
