"""A downloaded file checked against its pin (the digests themselves: :mod:`gemmar_aot.util.filedigest`)."""

from __future__ import annotations

from pathlib import Path

from gemmar_aot.util.errors import ToolchainError
from gemmar_aot.util.filedigest import sha256_file

__all__ = ["verify_sha256"]


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
