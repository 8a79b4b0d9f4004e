"""A compile worker: one process, FlyDSL imported once, many specs compiled in it.

Everything that makes FlyDSL compile for gfx950 without a GPU is set up here,
once per process (``init``): the compile-only environment, mori's device modules
imported without ROCm, and -- unless debug locations are asked for -- FlyDSL's
source-location capture replaced by ``Location.unknown()`` and its per-pass IR
verifier off. The capture walks
Python frames with ``inspect`` for every op and is ~85% of a GEMM's compile time;
the emitted code object is byte-identical without it (tests check this), only
compile errors lose their user source lines.

``compile_spec`` never raises for a builder failure: it returns a failed result
carrying the builder's error, so one bad spec does not stop the others.
"""

from __future__ import annotations

import os
import time
import traceback
from dataclasses import dataclass
from typing import Any

from gemmar_aot.codeobject import parse_code_object
from gemmar_aot.spec import KernelSpec

_STATE: dict[str, Any] = {}


@dataclass(frozen=True)
class CompiledKernel:
    """What one compile produces, before it is stored."""

    code: bytes
    metadata: dict  # KernelMetadata.to_json() of the one kernel
    launch: dict  # LaunchRecord.to_json()


@dataclass(frozen=True)
class CompileResult:
    """What a worker reports back for one spec (the bytes stay in the store)."""

    spec_id: str
    ok: bool
    seconds: float
    record: dict | None = None  # the store's record for the key
    hit: bool = False  # another builder stored it first (we waited on its lock)
    error: str = ""


def init(toolchain_root: str | None, debug_locations: bool) -> None:
    """Prepare this process to compile. Idempotent."""
    if _STATE.get("ready"):
        return
    from gemmar_aot.toolchain import compile_env, import_mori_device, load_toolchain

    tc = load_toolchain(toolchain_root)
    env = compile_env(tc)
    # Only what the key records may steer code generation: drop every other FlyDSL
    # or mori knob (dump, debug-info, opt-level overrides, MORI_GEMM_AR_* tuning)
    # inherited from the caller. Specs that read an env value carry it themselves.
    for name in list(os.environ):
        if name.startswith(("FLYDSL_", "MORI_")) and name not in env:
            del os.environ[name]
    os.environ.update(env)
    import_mori_device(tc)
    if not debug_locations:
        _disable_location_capture()
        # The MLIR verifier between passes only checks (it never rewrites), so the bytes
        # are the same without it (tests compare against mori's path, verifier on); it is
        # ~9% of a GEMM's compile. FlyDSL still verifies the traced module before lowering,
        # and --debug-locations turns the per-pass verifier back on to localise a failure.
        os.environ["FLYDSL_DEBUG_ENABLE_VERIFIER"] = "0"
    _STATE.update(ready=True, toolchain=tc)


def _disable_location_capture() -> None:
    """Swap FlyDSL's per-op frame walk for an unknown location, everywhere it was imported."""
    from flydsl._mlir import ir
    import flydsl.compiler.ast_rewriter as ast_rewriter
    import flydsl.compiler.kernel_function as kernel_function
    import flydsl.expr.meta as meta

    def unknown_location():
        return ir.Location.unknown()

    for mod in (meta, kernel_function, ast_rewriter):
        if not hasattr(mod, "capture_user_location"):
            raise RuntimeError(
                f"{mod.__name__} has no capture_user_location: this FlyDSL differs from the "
                f"pinned one; re-pin it or use --debug-locations"
            )
        mod.capture_user_location = unknown_location


def _arg_kinds(fn, args: tuple) -> tuple[list[str], list[tuple[str, str]]]:
    import torch

    names = list(fn._sig.parameters)
    kinds: list[tuple[str, str]] = []
    for a in args:
        if isinstance(a, torch.Tensor):
            kinds.append(("tensor", str(a.dtype).replace("torch.", "")))
        elif isinstance(a, int):
            kinds.append(("int", ""))
        else:
            raise TypeError(f"unexpected placeholder argument {a!r}")
    kinds.append(("stream", ""))
    if len(names) != len(kinds):
        raise RuntimeError(f"launcher {fn.__name__} takes {names}, traced with {len(kinds)} arguments")
    return names, kinds


def _code_object_bytes(ir_text: str) -> bytes:
    from flydsl._mlir import ir
    from flydsl._mlir.dialects import gpu
    from flydsl.compiler.jit_function import _create_mlir_context

    with _create_mlir_context():
        module = ir.Module.parse(ir_text)
        binaries = [op for op in module.body.operations if op.operation.name == "gpu.binary"]
        if len(binaries) != 1:
            raise RuntimeError(f"expected one gpu.binary in the lowered module, found {len(binaries)}")
        objects = binaries[0].attributes["objects"]
        if len(objects) != 1:
            raise RuntimeError(f"expected one gpu.object, found {len(objects)}")
        return bytes(gpu.ObjectAttr(objects[0]).object)


def compile_kernel(spec: KernelSpec) -> CompiledKernel:
    """Trace, lower and link one spec; raise on any failure."""
    from gemmar_aot.compiler.hostir import read_launch_record
    from gemmar_aot_kernels import recipe_module
    import flydsl.expr as fx

    fn, args = recipe_module(spec.recipe).build(spec)
    fn._last_compiled = None
    fn(*args, stream=fx.Stream(None))  # COMPILE_ONLY=1: trace, lower, link; no launch
    last = getattr(fn, "_last_compiled", None)
    if last is None:
        raise RuntimeError("FlyDSL produced no artifact (was COMPILE_ONLY honoured?)")
    ir_text = last[1]._ir_text
    code = _code_object_bytes(ir_text)
    co = parse_code_object(code)
    if co.arch != "gfx950":
        raise RuntimeError(f"compiled for {co.arch}, expected gfx950")
    if co.undefined_symbols:
        raise RuntimeError(
            f"code object references undefined symbols {list(co.undefined_symbols)}: the cco "
            f"device bitcode did not provide them (wrong or empty MORI_CCO_BC?)"
        )
    kernel = co.kernel()
    names, kinds = _arg_kinds(fn, args)
    record = read_launch_record(ir_text, names, kinds)
    if record.kernel != kernel.name:
        raise RuntimeError(f"host IR launches {record.kernel!r} but the code object holds {kernel.name!r}")
    return CompiledKernel(code, kernel.to_json(), record.to_json())


def _store(root: str):
    from gemmar_aot.store import Store

    stores = _STATE.setdefault("stores", {})
    if root not in stores:
        stores[root] = Store(root)
    return stores[root]


def compile_spec(spec_json: dict, store_root: str, key: str, ingredients: dict) -> CompileResult:
    """Compile one spec into the store under ``key``, unless another builder already did.

    The per-key claim is held while compiling, so concurrent builders compile each
    key once: the second waits and reuses. Builder errors come back as data.
    """
    spec = KernelSpec.from_json(spec_json)
    t0 = time.perf_counter()
    try:
        store = _store(store_root)
        with store.claim(key) as claim:
            if claim.hit is not None:
                return CompileResult(spec.spec_id, True, time.perf_counter() - t0, claim.hit, hit=True)
            k = compile_kernel(spec)
            seconds = time.perf_counter() - t0
            rec = claim.put(k.code, {
                "spec": spec.to_json(),
                "metadata": k.metadata,
                "launch": k.launch,
                "ingredients": ingredients,
                "compile_seconds": round(seconds, 3),
            })
        return CompileResult(spec.spec_id, True, seconds, rec)
    except BaseException as exc:  # noqa: BLE001 - report every builder failure as data
        if isinstance(exc, KeyboardInterrupt):
            raise
        msg = "".join(traceback.format_exception_only(type(exc), exc)).strip()
        tb = traceback.format_exc(limit=-6)
        return CompileResult(spec.spec_id, False, time.perf_counter() - t0, error=f"{msg}\n{tb}")


def compile_batch(items: list[tuple[dict, str, dict]], store_root: str) -> list[CompileResult]:
    """``compile_spec`` for each (spec, key, ingredients), in order, in this worker."""
    return [compile_spec(spec_json, store_root, key, ingr) for spec_json, key, ingr in items]
