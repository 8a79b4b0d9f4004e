"""The derive action: (code object, launcher) -> the record fields the runtime reads.

A build is two actions, as Bazel would split it, because their inputs differ:

1. **compile** (``worker.compile_code``; FlyDSL, seconds a kernel): toolchain + resolved spec
   + compile code -> the code object and the *launcher*: the host function FlyDSL lowered
   for the kernel (its MLIR text without the ``gpu.binary``, ~2 KB) and the launcher's
   parameter names and kinds. Both are blobs in the CAS; the action key covers only this.
2. **derive** (:func:`derive`, this module; milliseconds): the two blobs + the derive code
   (the note parser, the launch-record reader, this module) -> the kernel metadata and the
   launch record. Its key (:func:`derive_key`) is the digests of its inputs and of the
   derive code (``keys.derive_code_digest``).

A record stores both: the compile outputs by digest (``blob``, ``launcher``), the derived
fields, and ``derive`` naming the derive key and the derive code it came from. A record
whose ``derive.code`` is not this process's derive code is stale, never wrong and never a
miss: :func:`rederive` recomputes its derived fields from its verified blobs (a store's,
a remote cache's), with zero compiles. A record without a launcher cannot be re-derived
and is a miss.

Standard library only (no FlyDSL): the store's tools and a wheel build can re-derive.
"""

from __future__ import annotations

import json
from typing import Any, Mapping

from gemmar_aot.model.codeobject import parse_code_object
from gemmar_aot.compiler.hostir import read_launch_record
from gemmar_aot.compiler.launcher import Launcher, LauncherError
from gemmar_aot.util.filedigest import sha256_hex

#: The architecture every code object here is compiled for.
ARCH = "gfx950"


class DeriveError(ValueError):
    """A code object or launcher the derive step cannot turn into a trustworthy record."""


def derive(code: bytes, launcher: bytes) -> dict[str, Any]:
    """The derived record fields, ``{"metadata": ..., "launch": ...}``; DeriveError when the
    code object or the launcher is not what a gemmar-aot record may describe."""
    from gemmar_aot.compiler.hostir import HostIRError

    try:
        ln = Launcher.from_bytes(launcher)
    except LauncherError as e:
        raise DeriveError(f"launcher: {e}") from None
    try:
        co = parse_code_object(code)
    except ValueError as e:
        raise DeriveError(f"code object: {e}") from None
    if co.arch != ARCH:
        raise DeriveError(f"compiled for {co.arch}, expected {ARCH}")
    if co.undefined_symbols:
        raise DeriveError(
            f"code object references undefined symbols {list(co.undefined_symbols)}: the cco "
            f"device bitcode did not provide them (wrong or empty MORI_CCO_BC?)")
    kernel = co.kernel()
    try:
        record = read_launch_record(ln.host_ir, list(ln.arg_names), [tuple(k) for k in ln.arg_kinds])
    except HostIRError as e:
        raise DeriveError(f"launcher: {e}") from None
    if record.kernel != kernel.name:
        raise DeriveError(f"host IR launches {record.kernel!r} but the code object holds {kernel.name!r}")
    return {"metadata": kernel.to_json(), "launch": record.to_json()}


def derive_key(code_digest: str, launcher_digest: str) -> str:
    """The derive action's key: its two input blobs and the derive code."""
    from gemmar_aot.compiler.keys import derive_code_digest

    doc = {"code_object": code_digest, "launcher": launcher_digest, "derive_code": derive_code_digest()}
    return sha256_hex(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())


def derived_fields(code: bytes, launcher: bytes) -> dict[str, Any]:
    """:func:`derive`'s fields plus the record's ``derive`` stamp."""
    from gemmar_aot.compiler.keys import derive_code_digest

    out = derive(code, launcher)
    out["derive"] = {"code": derive_code_digest(),
                     "key": derive_key(sha256_hex(code), sha256_hex(launcher))}
    return out


def with_derived(rec: Mapping[str, Any], code: bytes, launcher: bytes) -> dict:
    """``rec`` (a record, or a record's fields) with its derived fields made by this derive code
    from ``code`` and ``launcher``: the one way a record's derived part is (re)made."""
    return {**rec, **derived_fields(code, launcher)}


def is_current(rec: Mapping[str, Any]) -> bool:
    """Whether ``rec``'s derived fields were made by this process's derive code."""
    from gemmar_aot.compiler.keys import derive_code_digest

    d = rec.get("derive")
    return isinstance(d, Mapping) and d.get("code") == derive_code_digest()


def rederive(store, key: str, rec: Mapping[str, Any], *, writer=None) -> dict | None:
    """``rec`` with its derived fields made again from its verified blobs in ``store`` and
    written back under ``key`` (through ``writer``, a Store on the same root, when given); None
    when it cannot be (no launcher: the kernel must be compiled again). Raises DeriveError when
    the stored blobs do not derive (never stored)."""
    from gemmar_aot.store.backend import record_blob, record_launcher
    from gemmar_aot.store.errors import BlobNotFoundError, CorruptArtifactError

    if "launcher" not in rec:
        return None
    code_ref, ln_ref = record_blob(rec), record_launcher(rec)
    try:
        code = store.load_blob(code_ref.hash, code_ref.size)
        launcher = store.load_blob(ln_ref.hash, ln_ref.size)
    except (BlobNotFoundError, CorruptArtifactError):
        return None
    new = with_derived(rec, code, launcher)
    (writer or store).put_record(key, new)
    return new
