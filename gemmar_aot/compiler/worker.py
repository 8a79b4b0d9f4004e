"""A compile worker: one process, FlyDSL imported once, many specs compiled in it.

Everything that makes FlyDSL compile for gfx950 without a GPU is set up here,
once per process (``init``): the compile-only environment, mori's device modules
imported without ROCm, and -- unless debug locations are asked for -- FlyDSL's
source-location capture replaced by ``Location.unknown()`` and its per-pass IR
verifier off. The capture walks Python frames with ``inspect`` for every op and is
~85% of a GEMM's compile time; the emitted code object is byte-identical without it
(tests check this), only compile errors lose their user source lines.

Work FlyDSL repeats on every call that is not compilation is done once or not at all
(``_install_fast_paths``; every one leaves the bytes unchanged, tests compare against
mori's own path):

* the builder's AST rewrite: FlyDSL re-parses and rewrites a kernel's source each time
  a builder creates it. The rewrite depends only on the code
  object, so it is done once per code object per worker and re-bound to each new closure;
* the print/re-parse of the lowered module in a fresh MLIR context to read the code
  object back: the ``gpu.binary`` is read from the lowered module;
* ``Numeric.from_ir_type`` builds a 29-entry dict of MLIR types on each of its ~2,900
  calls per GEMM to look one up: the answer is kept per type.

Not removed: FlyDSL prints the traced module and parses it back before lowering. Lowering
the traced module in place instead aborts inside MLIR (``DictionaryAttr element names
must be unique``): the round trip normalises attributes that tracing sets twice.

``compile_spec`` never raises for a builder failure: it returns a failed result
carrying the builder's error, so one bad spec does not stop the others. ``serve`` is
the loop of a local pool worker (see ``driver``); ``compile_kernel`` alone is what a
remote executor runs after ``init``.
"""

from __future__ import annotations

import inspect
import os
import signal
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Any

from gemmar_aot.util.filedigest import sha256_hex
from gemmar_aot.model.spec import KernelSpec

_STATE: dict[str, Any] = {}

@dataclass(frozen=True)
class CompiledKernel:
    """What one compile and its derive produce, before they are stored."""

    code: bytes
    launcher: bytes  # compiler.launcher.Launcher bytes
    derived: dict  # derive.derived_fields(): metadata, launch, the derive stamp


@dataclass(frozen=True)
class CompileResult:
    """What a worker reports back for one spec (the bytes stay in the store)."""

    spec_id: str
    ok: bool
    seconds: float
    record: dict | None = None  # the store's record for the key
    hit: bool = False  # another builder stored it first (we waited on its lock)
    error: str = ""
    cpu_seconds: float = 0.0  # this process's CPU time for the spec (robust on a loaded machine)
    #: (phase, start, end) on the machine's monotonic clock: "trace", "compile", "store"
    phases: tuple = field(default=())
    pid: int = 0


# ---- process lifecycle ----

PR_SET_PDEATHSIG = 1


def die_with_parent(parent_pid: int) -> None:
    """End this process when ``parent_pid`` goes away, however it ends (SIGKILL, OOM).

    Two mechanisms: the kernel's parent-death signal (immediate; tied to the thread
    that spawned us, which is the parent's main thread in our pools), and a watchdog
    thread that notices being reparented (covers the race before prctl, and platforms
    without it). Both end the process at once, without cleanup: nothing a worker holds
    needs it (store writes are atomic; an abandoned temp file is gc'd)."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:  # the parent died before prctl took effect
        os._exit(1)

    def watch() -> None:
        while True:
            time.sleep(0.5)
            if os.getppid() != parent_pid:
                os._exit(1)

    threading.Thread(target=watch, name="gemmar-parent-watchdog", daemon=True).start()


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
    fast = _install_fast_paths()
    _STATE.update(ready=True, toolchain=tc, fast_paths=fast)


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


# ---- fast paths (same bytes, less repeated work) ----

def _source_digest(obj) -> str:
    return sha256_hex(inspect.getsource(obj).encode())


#: sha256 of FlyDSL 0.4.2's ASTRewriter.transform, whose result ``_cached_transform``
#: reuses; another FlyDSL's transform may depend on more than the code object, so it keeps
#: running every time.
_PINNED_TRANSFORM = "855fe40be644fe1c39bbe28f90709aa54d4e34c8a5892d1ebe2fd9fbd9b722d5"


#: sha256 of FlyDSL 0.4.2's Numeric.from_ir_type (a pure function of the type); another
#: FlyDSL's may depend on more, so it keeps running every time.
_PINNED_FROM_IR_TYPE = "e79b581f476d5f7c8622d256377b9e60795b75e09b841ac031c509f3aa7b4328"


def _install_fast_paths() -> list[str]:
    """Patch FlyDSL in this worker; returns the names of the fast paths in effect."""
    import flydsl.compiler.ast_rewriter as ar
    import flydsl.compiler.jit_function as jf
    import flydsl.expr.numeric as numeric

    installed = []
    if _source_digest(ar.ASTRewriter.transform) == _PINNED_TRANSFORM:
        ar.ASTRewriter.transform = classmethod(_cached_transform(ar.ASTRewriter.transform.__func__, ar))
        installed.append("ast-rewrite-once")
    if _source_digest(numeric.Numeric.from_ir_type) == _PINNED_FROM_IR_TYPE:
        numeric.Numeric.from_ir_type = staticmethod(_per_type(numeric.Numeric.from_ir_type))
        installed.append("ir-type-class-once")
    lower = jf.MlirCompiler.compile.__func__

    def compile_and_capture(cls, module, **kwargs):
        t0 = time.monotonic()
        lowered = lower(cls, module, **kwargs)
        _STATE["lowered"] = (t0, time.monotonic(), _binary_bytes(lowered))
        return lowered

    jf.MlirCompiler.compile = classmethod(compile_and_capture)
    installed.append("binary-from-module")
    return installed


def _cached_transform(transform, ar):
    """ASTRewriter.transform, done once per code object; each new function (a builder's
    closure) gets the rewritten code bound to its own cells, exactly as transform binds it."""
    import functools
    import types

    done: dict[types.CodeType, types.CodeType] = {}

    def cached(cls, f):
        code = f.__code__
        new_code = done.get(code)
        if new_code is None:
            out = transform(cls, f)
            done[code] = out.__code__
            return out
        if new_code is code:  # transform left it alone
            return f
        for name, val in cls.rewrite_globals.items():
            f.__globals__[name] = val
        if f.__closure__ and new_code.co_freevars != code.co_freevars:
            cells = dict(zip(code.co_freevars, f.__closure__))
            new_f = types.FunctionType(new_code, f.__globals__, f.__name__, f.__defaults__,
                                       tuple(cells[v] for v in new_code.co_freevars))
            new_f.__kwdefaults__ = f.__kwdefaults__
            functools.update_wrapper(new_f, f)
            return new_f
        f.__code__ = new_code
        return f

    return cached


def _per_type(from_ir_type):
    """``from_ir_type`` answered once per MLIR type. Keyed by the type's text, which MLIR
    prints uniquely per type, so the key is the same in every MLIR context (a type object
    is only valid in its own) and the cache holds no context alive. An unsupported type
    is not cached: it raises, as before, every time."""
    done: dict[str, type] = {}

    def per_type(ir_type):
        key = str(ir_type)
        cls = done.get(key)
        if cls is None:
            cls = done[key] = from_ir_type(ir_type)
        return cls

    return per_type


def _binary_bytes(module) -> bytes:
    """The code object inside the lowered module's one ``gpu.binary``."""
    from flydsl._mlir.dialects import gpu

    with module.context:
        binaries = [op for op in module.body.operations if op.operation.name == "gpu.binary"]
        if len(binaries) != 1:
            raise RuntimeError(f"expected one gpu.binary in the lowered module, found {len(binaries)}")
        objects = binaries[0].attributes["objects"]
        if len(objects) != 1:
            raise RuntimeError(f"expected one gpu.object, found {len(objects)}")
        return bytes(gpu.ObjectAttr(objects[0]).object)


def _code_object_bytes(ir_text: str) -> bytes:
    """The code object in a lowered module's text (FlyDSL's own artifact, for comparisons)."""
    from flydsl._mlir import ir
    from flydsl.compiler.jit_function import _create_mlir_context

    with _create_mlir_context():
        return _binary_bytes(ir.Module.parse(ir_text))


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


def compile_code(spec: KernelSpec, phases: list | None = None) -> tuple[bytes, bytes]:
    """The compile action: trace, lower and link one spec into (code object, launcher bytes);
    raise on any failure. Needs ``init`` first. Nothing after the code object exists runs here:
    what is read out of it is the derive step (:mod:`gemmar_aot.compiler.derive`), whose code
    is not in the action key.

    ``phases``, if given, receives ("trace", t0, t1) and ("compile", t1, t2) on the
    monotonic clock: tracing is the builder call and FlyDSL's Python tracing, compile the
    MLIR/LLVM pipeline, the link and reading the result back."""
    from gemmar_aot_kernels import recipe_module
    import flydsl.expr as fx

    if not _STATE.get("ready"):
        raise RuntimeError("compile_kernel before worker.init(): call init(toolchain_root, debug_locations)")
    t0 = time.monotonic()
    fn, args = recipe_module(spec.recipe).build(spec)
    fn._last_compiled = None
    _STATE["lowered"] = None
    fn(*args, stream=fx.Stream(None))  # COMPILE_ONLY=1: trace, lower, link; no launch
    last = getattr(fn, "_last_compiled", None)
    lowered = _STATE.pop("lowered", None)
    if last is None or lowered is None:
        raise RuntimeError("FlyDSL produced no artifact (was COMPILE_ONLY honoured?)")
    t_lower0, _t_lower1, code = lowered
    names, kinds = _arg_kinds(fn, args)
    launcher = _launcher_bytes(last[1]._ir_text, names, kinds)
    if phases is not None:
        phases.append(("trace", t0, t_lower0))
        phases.append(("compile", t_lower0, time.monotonic()))
    return code, launcher


def _launcher_bytes(ir_text: str, names: list[str], kinds: list[tuple[str, str]]) -> bytes:
    from gemmar_aot.compiler.launcher import Launcher

    return Launcher.from_lowered(ir_text, names, kinds).to_bytes()


def compile_kernel(spec: KernelSpec, phases: list | None = None) -> CompiledKernel:
    """Compile one spec, then derive its record fields; raise on any failure. Needs ``init`` first."""
    from gemmar_aot.compiler.derive import derived_fields

    code, launcher = compile_code(spec, phases)
    return CompiledKernel(code, launcher, derived_fields(code, launcher))


def _store(root: str):
    from gemmar_aot.store import Store

    stores = _STATE.setdefault("stores", {})
    if root not in stores:
        stores[root] = Store(root)
    return stores[root]


def record_fields(spec: KernelSpec, k: CompiledKernel, ingredients: dict, seconds: float) -> dict:
    """The store record's fields for one compiled spec (the store adds schema, key and blob)."""
    return {
        "spec": spec.to_json(),
        **k.derived,
        "ingredients": ingredients,
        "compile_seconds": round(seconds, 3),
    }


def _current(rec: dict) -> bool:
    from gemmar_aot.compiler.derive import is_current

    return is_current(rec)


def _failed(spec: KernelSpec, exc: BaseException, t0: float, c0: float, phases: list) -> CompileResult:
    """A builder failure as data: the exception line and the innermost frames. Call in ``except``."""
    if isinstance(exc, KeyboardInterrupt):
        raise exc
    msg = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    tb = traceback.format_exc(limit=-6)
    return CompileResult(spec.spec_id, False, time.perf_counter() - t0, error=f"{msg}\n{tb}",
                         cpu_seconds=time.process_time() - c0, phases=tuple(phases), pid=os.getpid())


def compile_spec(spec_json: dict, store_root: str, key: str, ingredients: dict) -> CompileResult:
    """Compile one spec into the store under ``key``, unless another builder already did.

    The per-key claim is held while compiling, so concurrent builders compile each
    key once: the second waits and reuses. Builder errors come back as data.
    """
    spec = KernelSpec.from_json(spec_json)
    t0 = time.perf_counter()
    c0 = time.process_time()
    phases: list = []
    pid = os.getpid()
    try:
        store = _store(store_root)
        with store.claim(key) as claim:
            # A hit made by other derive code that the build could not derive again is compiled.
            if claim.hit is not None and _current(claim.hit):
                return CompileResult(spec.spec_id, True, time.perf_counter() - t0, claim.hit, hit=True, pid=pid)
            k = compile_kernel(spec, phases)
            seconds = time.perf_counter() - t0
            t_store = time.monotonic()
            rec = claim.put(k.code, record_fields(spec, k, ingredients, seconds), launcher=k.launcher)
            phases.append(("store", t_store, time.monotonic()))
        return CompileResult(spec.spec_id, True, seconds, rec, cpu_seconds=time.process_time() - c0,
                             phases=tuple(phases), pid=pid)
    except BaseException as exc:  # noqa: BLE001 - report every builder failure as data
        return _failed(spec, exc, t0, c0, phases)


def compile_detached(spec_json: dict, ingredients: dict) -> tuple[CompileResult, tuple[bytes, bytes] | None]:
    """Compile one spec without a store: (result, (code, launcher) bytes, or None when it failed).

    For executors whose workers do not write the store (a Ray node): ``result.record``
    holds the record's *fields*; the one writer stores the code and the launcher with them
    under the key.
    """
    spec = KernelSpec.from_json(spec_json)
    t0 = time.perf_counter()
    c0 = time.process_time()
    phases: list = []
    try:
        k = compile_kernel(spec, phases)
        seconds = time.perf_counter() - t0
        return CompileResult(spec.spec_id, True, seconds, record_fields(spec, k, ingredients, seconds),
                             cpu_seconds=time.process_time() - c0, phases=tuple(phases),
                             pid=os.getpid()), (k.code, k.launcher)
    except BaseException as exc:  # noqa: BLE001 - report every builder failure as data
        return _failed(spec, exc, t0, c0, phases), None


def compile_batch(items: list[tuple[dict, str, dict]], store_root: str) -> list[CompileResult]:
    """``compile_spec`` for each (spec, key, ingredients), in order, in this worker."""
    return [compile_spec(spec_json, store_root, key, ingr) for spec_json, key, ingr in items]


def serve(conn, parent_pid: int, toolchain_root: str | None, debug_locations: bool) -> None:
    """A pool worker's life: die with the parent, initialise, then compile what arrives.

    Messages in: (store_root, [(spec_json, key, ingredients), ...]) or None (exit).
    Messages out: ("ready", pid, (t0, t1, cpu_seconds)) once, then ("done", [CompileResult, ...]) per batch,
    or ("init-failed", pid, error). The parent owns interruption: SIGINT is ignored here
    (Ctrl-C reaches the whole process group) and the parent ends workers when it stops."""
    die_with_parent(parent_pid)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    t0, c0 = time.monotonic(), time.process_time()
    try:
        init(toolchain_root, debug_locations)
    except BaseException as exc:  # noqa: BLE001
        conn.send(("init-failed", os.getpid(), "".join(traceback.format_exception_only(type(exc), exc)).strip()))
        return
    conn.send(("ready", os.getpid(), (t0, time.monotonic(), time.process_time() - c0)))
    while True:
        try:
            msg = conn.recv()
        except EOFError:
            return
        if msg is None:
            return
        store_root, items = msg
        conn.send(("done", compile_batch(items, store_root)))
