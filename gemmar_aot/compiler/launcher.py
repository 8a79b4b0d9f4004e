"""The launcher blob: the compile action's second output, what the derive step reads.

FlyDSL lowers each launcher into a module holding the code object (``gpu.binary``) and one
host function that computes the grid and block from the launcher's parameters and
launches the kernel. The compile step keeps that host function's text (the module without
its ``gpu.binary``, ~2 KB) and the launcher's parameter names and kinds, as canonical JSON
in a blob of its own, so the record (:mod:`gemmar_aot.compiler.derive`) can be made again
from stored blobs without compiling.

This module is compile code (``keys.COMPILE_CODE``): it shapes the launcher's bytes.
Standard library only.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

#: Bump when the launcher blob's shape changes.
LAUNCHER_SCHEMA = 1


class LauncherError(ValueError):
    """Bytes that are not a launcher blob this gemmar-aot reads."""


@dataclass(frozen=True)
class Launcher:
    """What the compile step keeps of FlyDSL's host launcher: enough to read a launch record."""

    host_ir: str  # the lowered module's text without its gpu.binary
    arg_names: tuple[str, ...]
    arg_kinds: tuple[tuple[str, str], ...]  # ("tensor", dtype) | ("int", "") | ("stream", "")

    def to_bytes(self) -> bytes:
        doc = {"schema": LAUNCHER_SCHEMA, "host_ir": self.host_ir, "arg_names": list(self.arg_names),
               "arg_kinds": [list(k) for k in self.arg_kinds]}
        return json.dumps(doc, sort_keys=True, separators=(",", ":"), ensure_ascii=True).encode()

    @classmethod
    def from_bytes(cls, data: bytes) -> "Launcher":
        try:
            doc = json.loads(data)
        except (ValueError, UnicodeDecodeError) as e:
            raise LauncherError(f"not JSON ({e})") from None
        if not isinstance(doc, dict) or doc.get("schema") != LAUNCHER_SCHEMA:
            got = doc.get("schema") if isinstance(doc, dict) else None
            raise LauncherError(f"launcher schema {got!r}, this gemmar-aot reads {LAUNCHER_SCHEMA}")
        try:
            return cls(str(doc["host_ir"]), tuple(str(n) for n in doc["arg_names"]),
                       tuple((str(k), str(d)) for k, d in doc["arg_kinds"]))
        except (KeyError, TypeError, ValueError) as e:
            raise LauncherError(f"malformed launcher ({type(e).__name__}: {e})") from None

    @classmethod
    def from_lowered(cls, lowered_module_text: str, arg_names, arg_kinds) -> "Launcher":
        """From FlyDSL's lowered module text: every line but the ``gpu.binary`` (the code object,
        hex-escaped, which is a blob of its own)."""
        host = "\n".join(line for line in lowered_module_text.splitlines()
                         if not line.lstrip().startswith("gpu.binary"))
        return cls(host, tuple(arg_names), tuple(tuple(k) for k in arg_kinds))
