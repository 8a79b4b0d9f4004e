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
fields, and ``derive`` naming the derive key and the derive code it came from.

A kernel mori loads whole and launches itself (its hipcc-JIT code objects,
:data:`WHOLE_OBJECT_RECIPES`) has no launcher: its derived fields come from the code object
alone (:func:`derive_object`: its target and the kernels it defines). A record
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

#: The architecture every FlyDSL code object here is compiled for.
ARCH = "gfx950"
#: Recipes whose code objects mori loads whole (no launcher): derived from the code object alone.
WHOLE_OBJECT_RECIPES = frozenset({"hipcc", "jitv2"})


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
    co = _code_object(code, ARCH, ": the cco device bitcode did not provide them (wrong or empty MORI_CCO_BC?)")
    kernel = co.kernel()
    try:
        record = read_launch_record(ln.host_ir, list(ln.arg_names), [tuple(k) for k in ln.arg_kinds])
    except HostIRError as e:
        raise DeriveError(f"launcher: {e}") from None
    if record.kernel != kernel.name:
        raise DeriveError(f"host IR launches {record.kernel!r} but the code object holds {kernel.name!r}")
    return {"metadata": kernel.to_json(), "launch": record.to_json()}


def _code_object(code: bytes, arch: str, undefined_why: str = ""):
    """``code`` parsed, a code object for ``arch`` that references no undefined symbol; else DeriveError."""
    try:
        co = parse_code_object(code)
    except ValueError as e:
        raise DeriveError(f"code object: {e}") from None
    if co.arch != arch:
        raise DeriveError(f"compiled for {co.arch}, expected {arch}")
    if co.undefined_symbols:
        raise DeriveError(f"code object references undefined symbols {list(co.undefined_symbols)}{undefined_why}")
    return co


def derive_object(code: bytes, arch: str) -> dict[str, Any]:
    """The derived record fields of a code object loaded whole, ``{"metadata": {"target",
    "kernels"}}``: what it is compiled for and the kernels it defines, in its note's order.
    DeriveError when it is not a loadable code object for ``arch``."""
    co = _code_object(code, arch)
    if not co.kernels:
        raise DeriveError("code object defines no kernel")
    return {"metadata": {"target": co.target, "kernels": [k.name for k in co.kernels]}}


def whole_object_arch(rec: Mapping[str, Any]) -> str | None:
    """The arch of a record's code object when it is loaded whole (no launcher), else None."""
    spec = rec.get("spec")
    if isinstance(spec, Mapping) and spec.get("recipe") in WHOLE_OBJECT_RECIPES:
        params = spec.get("params")
        return params.get("arch") if isinstance(params, Mapping) else None
    return None


def derive_key(code_digest: str, launcher_digest: str | None) -> str:
    """The derive action's key: its two input blobs and the derive code."""
    from gemmar_aot.compiler.keys import derive_code_digest

    doc = {"code_object": code_digest, "launcher": launcher_digest, "derive_code": derive_code_digest()}
    return sha256_hex(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode())


def derived_fields(code: bytes, launcher: bytes | None, arch: str | None = None) -> dict[str, Any]:
    """:func:`derive`'s fields (:func:`derive_object`'s for a code object loaded whole: no
    ``launcher``, its ``arch`` given) plus the record's ``derive`` stamp."""
    from gemmar_aot.compiler.keys import derive_code_digest

    out = derive(code, launcher) if launcher is not None else derive_object(code, arch or ARCH)
    out["derive"] = {"code": derive_code_digest(),
                     "key": derive_key(sha256_hex(code), None if launcher is None else sha256_hex(launcher))}
    return out


def with_derived(rec: Mapping[str, Any], code: bytes, launcher: bytes | None) -> dict:
    """``rec`` (a record, or a record's fields) with its derived fields made by this derive code
    from ``code`` and ``launcher`` (None: a code object loaded whole, of the arch its spec names):
    the one way a record's derived part is (re)made."""
    return {**rec, **derived_fields(code, launcher, whole_object_arch(rec))}


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
    from gemmar_aot.store.store_errors import BlobNotFoundError, CorruptArtifactError

    whole = whole_object_arch(rec) is not None
    if "launcher" not in rec and not whole:
        return None
    code_ref, ln_ref = record_blob(rec), record_launcher(rec)
    try:
        code = store.load_blob(code_ref.hash, code_ref.size)
        launcher = None if whole else store.load_blob(ln_ref.hash, ln_ref.size)
    except (BlobNotFoundError, CorruptArtifactError):
        return None
    new = with_derived(rec, code, launcher)
    (writer or store).put_record(key, new)
    return new
