"""sha256, the one digest: of bytes, of files and of trees of files, and what a digest looks
like. Standard library only, so the build side (the toolchain, the keys), the store and the
runtime (the pod's mori check) use the same ones."""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable, Iterable
from pathlib import Path

_CHUNK = 1 << 20
_HEX64 = re.compile(r"[0-9a-f]{64}")


def sha256_hex(data: bytes) -> str:
    """Hex sha256 of ``data``: the one way a digest of bytes is spelled."""
    return hashlib.sha256(data).hexdigest()


def is_hex64(s: object) -> bool:
    """Whether ``s`` is 64 lowercase hex digits (a sha256)."""
    return type(s) is str and _HEX64.fullmatch(s) is not None


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
