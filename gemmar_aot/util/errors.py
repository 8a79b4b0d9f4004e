"""Errors the tool raises on purpose. Each one says what was wrong and how to fix it."""

from __future__ import annotations


class GemmarError(Exception):
    """Base class: an error the CLI reports without a traceback (exit code 2)."""


class ManifestError(GemmarError):
    """A manifest is invalid. Carries every problem found, not just the first."""

    def __init__(self, problems: list[str]):
        self.problems = list(problems)
        n = len(self.problems)
        head = f"{n} problem{'s' if n != 1 else ''} in manifest; nothing was compiled:"
        super().__init__("\n".join([head] + [f"  - {p}" for p in self.problems]))


class ToolchainError(GemmarError):
    """A piece of the build toolchain is missing or does not match its pin."""


class CompileError(GemmarError):
    """One or more kernel specs failed to compile."""
