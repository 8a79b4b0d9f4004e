"""sha256 digests of files and trees, and verification against pins."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from pathlib import Path

from ..errors import ToolchainError

_CHUNK = 1 << 20


def sha256_file(path: Path) -> str:
    """Hex sha256 of a file's content."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest()


def verify_sha256(path: Path, expected: str, *, fix: str = "") -> str:
    """Return the file's digest if it equals ``expected``; else raise a
    ToolchainError naming the file, the expected and the actual digest."""
    if not Path(path).is_file():
        raise ToolchainError(f"{path}: file is missing (expected sha256 {expected}){_tail(fix)}")
    actual = sha256_file(path)
    if actual != expected.lower():
        raise ToolchainError(
            f"sha256 mismatch for {Path(path).name} ({path}):\n"
            f"  expected {expected}\n"
            f"  actual   {actual}{_tail(fix)}"
        )
    return actual


def _tail(fix: str) -> str:
    return f"\n  fix: {fix}" if fix else ""


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
