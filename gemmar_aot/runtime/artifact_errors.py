"""Errors the runtime raises on purpose. Each says what was wrong and what to do about it.

All of them are :class:`~gemmar_aot.util.errors.GemmarError` subclasses, so a caller can
catch the runtime's deliberate failures in one place. Operand and argument errors
that mori's op raises as ``ValueError`` stay ``ValueError`` here, so code written
against ``mori.ops.gemm_ar.GemmAllReduceOp`` keeps catching what it caught.
"""

from __future__ import annotations

from gemmar_aot.util.errors import GemmarError


class ArtifactError(GemmarError):
    """The compiled artifacts cannot serve this op (absent, inconsistent, wrong target)."""


class ArtifactNotFoundError(ArtifactError):
    """No artifacts were found at all: nothing given, nothing in the environment or installed."""


class ArtifactConflictError(ArtifactError):
    """Two artifact sources hold different kernels for the same (tuple, rank)."""


class ArtifactMismatchError(ArtifactError, ValueError):
    """The artifacts exist but were built for something else (m_max, arch, layout, ...)."""


class ArtifactSignatureError(ArtifactError):
    """Trusted keys are set and a lock is not vouched for: unsigned, signed by an untrusted, revoked
    or expired key, or its signature covers other bytes (:mod:`gemmar_aot.trust`)."""


class ArtifactMissingError(ArtifactError, LookupError):
    """A call (or the constructor) needs an M the artifacts do not hold.

    ``m`` is the padded M asked for, ``available`` the padded M values that do
    exist for this op's (n, k, world, quant, wire, rank), ``nearest`` the closest
    ones below and above, and ``manifest_lines`` a ``[[tuple]]`` TOML snippet that
    builds the missing M into the same window layout.
    """

    def __init__(self, message: str, *, m: int, available: tuple[int, ...] = (),
                 nearest: tuple[int, ...] = (), manifest_lines: str = ""):
        self.m = m
        self.available = tuple(available)
        self.nearest = tuple(nearest)
        self.manifest_lines = manifest_lines
        super().__init__(message)


class HipError(GemmarError, RuntimeError):
    """The HIP runtime is missing or a HIP call failed. Names the call and the error string."""


class SelfTestError(GemmarError, RuntimeError):
    """The startup self-test found that the all-reduce does not move bytes."""
