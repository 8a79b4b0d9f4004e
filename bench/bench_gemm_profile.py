"""Where one reference GEMM's compile time goes: Python tracing, MLIR passes, LLVM, the link.

In one compile worker (``worker.init``: the build's own settings), compiles one GEMM of
MANIFEST once to warm up, then ROUNDS more times with a timed copy of FlyDSL's
``MlirCompiler.compile`` (its non-dump, embedded-codegen path, step for step) that
reports:

* the steps around the pipeline: verify, print + re-parse of the traced module, the
  compile hints;
* MLIR's own pass timing (``PassManager.enable_timing()``), one row per pass;
* inside ``gpu-module-to-binary`` (LLVM), from extra runs of that pass on copies of its
  input, each one step longer (MLIR's ``ModuleToObject::run`` translates, links the
  bitcode libraries, optimises, then serialises): ``translate_module_to_llvmir`` alone;
  ``format=llvm`` with the target's ``O = 0`` (translate + link the cco bitcode);
  ``format=llvm`` at ``O = 2`` (+ LLVM's O2 pipeline); ``format=isa`` (+ codegen to
  assembly). The rest of the real ``fatbin`` run is assembling and the ld.lld link, whose
  CPU is measured separately (``RUSAGE_CHILDREN``). Differences are taken within a round;
* outside FlyDSL's compile: the builder call, FlyDSL's Python tracing, and what the worker
  does after it (code object and launch record read back).

A last round runs under cProfile: the Python functions that take the tracing time (own
time), and the same grouped by package. Every round's code object must be byte-identical
to the warm-up's (plain ``compile_kernel``), so the timed copy compiles what the build does.

Times are process CPU seconds (``time.process_time``; MLIR's report is wall, on one
thread), medians over the rounds; the load average is recorded around the run.

    .venv/bin/python bench/bench_gemm_profile.py --rounds 3 \\
        --json-out bench/results/gemm-profile-dsv4-pro-wo_b-YYYY-MM-DD-<commit>.json
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import gc
import hashlib
import json
import os
import pstats
import re
import resource
import statistics
import sys
import tempfile
import time
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


@contextlib.contextmanager
def captured_fd2(sink: list[str]):
    """Everything written to file descriptor 2 (C++ included) inside the block, into ``sink``."""
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile(mode="w+b") as tmp:
        os.dup2(tmp.fileno(), 2)
        try:
            yield
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            sink.append(tmp.read().decode(errors="replace"))


_ROW = re.compile(r"^(\s*)([0-9.]+) \(\s*[0-9.]+%\)\s+(.+?)\s*$")


def parse_pass_timing(report: str) -> list[dict]:
    """MLIR's "Execution time report" (wall column only) as rows {pass, seconds, depth}."""
    rows = []
    started = False
    for line in report.splitlines():
        if "----Name----" in line:
            started = True
            continue
        m = _ROW.match(line) if started else None
        if m:
            rows.append({"pass": m.group(3), "seconds": float(m.group(2)), "depth": (len(m.group(1)) - 4) // 2})
    return rows


class TimedCompile:
    """FlyDSL 0.4.2's ``MlirCompiler.compile`` (no IR dumps, embedded codegen), with timers."""

    def __init__(self, jf, split_binary: bool, profile: cProfile.Profile | None = None):
        self.jf = jf
        self.profile = profile  # paused inside: the profile is of the Python around the pipeline
        self.split_binary = split_binary
        self.steps: dict[str, float] = {}
        self.passes: list[dict] = []
        self.entered = self.left = 0.0

    def __call__(self, cls, module, *, arch="", func_name="", link_libs=None):
        jf = self.jf
        ir = jf.ir
        if self.profile:
            self.profile.disable()
        self.entered = time.process_time()
        clock = [self.entered]

        def step(name):
            now = time.process_time()
            self.steps[name] = self.steps.get(name, 0.0) + now - clock[0]
            clock[0] = now

        module.operation.verify()
        step("verify traced module")
        backend = jf.get_backend(arch=arch)
        hints = jf.CompilationContext.get_compile_hints()
        text = module.operation.get_asm(enable_debug_info=True)
        step("print traced module")
        module = ir.Module.parse(text)
        step("re-parse traced module")
        backend.lower_compile_hints(module, compile_hints=hints)
        cfg = jf._pipeline_fragments_for_mode(backend, compile_hints=hints)
        if cfg.external or jf.env.debug.dump_ir or jf.env.debug.dump_asm:
            raise RuntimeError("profile the embedded codegen without IR dumps (unset FLYDSL_COMPILE_LLVM_DIR, "
                               "FLYDSL_DUMP_IR, FLYDSL_DEBUG_DUMP_ASM)")
        fragments = cfg.fragments
        if link_libs:
            fragments, found = jf._append_link_lib_options_to_attach_targets(
                fragments, jf._format_link_lib_options(link_libs))
            if not found:
                raise RuntimeError("link_libs specified but no attach-target fragment found in pipeline")
        from flydsl.compiler.llvm_options import llvm_options

        ctx = llvm_options(cfg.llvm_opts) if cfg.llvm_opts else contextlib.nullcontext()
        step("compile hints, pipeline text")
        *head, last = fragments
        if not last.strip().startswith("gpu-module-to-binary"):
            raise RuntimeError(f"the pipeline ends with {last!r}, not gpu-module-to-binary")
        with ctx:
            self._run(module, head, "mlir passes")
            step("mlir passes")
            if self.split_binary:
                from flydsl._mlir._mlir_libs._mlirDialectsLLVM import translate_module_to_llvmir

                gpu_module = next(op for op in module.body.operations if op.operation.name == "gpu.module")
                c0 = time.process_time()
                translate_module_to_llvmir(gpu_module.operation)
                self.steps["translate to LLVM IR text (copy)"] = time.process_time() - c0
                asm = module.operation.get_asm(enable_debug_info=True)
                if asm.count("#rocdl.target<chip") != 1:  # O = 2 is the default, not printed
                    raise RuntimeError("expected one #rocdl.target<chip ...> (at O2) in the module before the binary")
                for fmt, opt in (("llvm", 0), ("llvm", 2), ("isa", 2)):
                    # O = 0: the same translation and bitcode link, (almost) no LLVM optimisation
                    copy = ir.Module.parse(asm if opt == 2 else asm.replace("#rocdl.target<chip",
                                                                            f"#rocdl.target<O = {opt}, chip"))
                    frag = re.sub(r"format=\w+", f"format={fmt}", last)
                    c0 = time.process_time()
                    self._run(copy, [frag], None)
                    self.steps[f"binary as {fmt} O{opt} (copy)"] = time.process_time() - c0
                    del copy
                clock[0] = time.process_time()
            kids0 = resource.getrusage(resource.RUSAGE_CHILDREN)
            self._run(module, [last], "gpu-module-to-binary")
            kids1 = resource.getrusage(resource.RUSAGE_CHILDREN)
            step("gpu-module-to-binary")
        self.steps["ld.lld (child process)"] = ((kids1.ru_utime - kids0.ru_utime)
                                                + (kids1.ru_stime - kids0.ru_stime))
        self.left = time.process_time()
        if self.profile:
            self.profile.enable()
        return module

    def _run(self, module, fragments, label):
        jf = self.jf
        pm = jf.PassManager.parse(f"builtin.module({','.join(fragments)})")
        pm.enable_verifier(jf.env.debug.enable_verifier)
        if label is None:
            jf._run_pass_manager(pm, module)
            return
        pm.enable_timing()
        out: list[str] = []
        with captured_fd2(out):
            jf._run_pass_manager(pm, module)
            del pm  # MLIR prints the timing report when the pass manager goes away
        rows = parse_pass_timing(out[0])
        if not rows:
            raise RuntimeError(f"no pass timing report from MLIR for {label}:\n{out[0][-2000:]}")
        for r in rows:
            r["stage"] = label
        self.passes += rows


def one_round(worker, spec, jf, split_binary: bool, profile: cProfile.Profile | None = None) -> dict:
    from gemmar_aot_kernels import recipe_module
    import flydsl.expr as fx

    timed = TimedCompile(jf, split_binary, profile)
    # The worker's wrapper (worker._install_fast_paths) calls the FlyDSL compile it saved at
    # init, from its closure cell ``lower``: point that cell at the timed copy for this round.
    capture = jf.MlirCompiler.compile.__func__
    lower_cell = dict(zip(capture.__code__.co_freevars, capture.__closure__))["lower"]
    original = lower_cell.cell_contents
    lower_cell.cell_contents = timed  # called as lower(cls, module, **kwargs)
    try:
        gc.collect()
        c0 = time.process_time()
        if profile:
            profile.enable()
        fn, args = recipe_module(spec.recipe).build(spec)
        c_built = time.process_time()
        fn._last_compiled = None
        worker._STATE["lowered"] = None
        fn(*args, stream=fx.Stream(None))
        c_called = time.process_time()
        if profile:
            profile.disable()
        code = worker._STATE.pop("lowered")[2]
        # what compile_kernel does after FlyDSL returns (code object, launch record)
        from gemmar_aot.model.codeobject import parse_code_object
        from gemmar_aot.compiler.hostir import read_launch_record

        co = parse_code_object(code)
        co.kernel()
        names, kinds = worker._arg_kinds(fn, args)
        read_launch_record(fn._last_compiled[1]._ir_text, names, kinds)
        c_end = time.process_time()
    finally:
        lower_cell.cell_contents = original
    steps = {"builder call (recipe build)": c_built - c0,
             "FlyDSL Python tracing (to MlirCompiler.compile)": timed.entered - c_built}
    steps.update(timed.steps)
    split = {k: steps.pop(k) for k in list(steps) if k.endswith("(copy)")}
    if split:  # differences within this round (the same load for each)
        b = steps["gpu-module-to-binary"]
        lld = steps["ld.lld (child process)"]
        translate = split["translate to LLVM IR text (copy)"]
        link = split["binary as llvm O0 (copy)"]
        opt = split["binary as llvm O2 (copy)"]
        isa = split["binary as isa O2 (copy)"]
        split = {
            "translate to LLVM IR (and print it as text)": translate,
            "link the cco bitcode (+ the O0 pipeline, write bitcode)": link - translate,
            "LLVM O2 pipeline (beyond O0)": opt - link,
            "codegen to assembly (isel, scheduling, regalloc, asm print)": isa - opt,
            "assemble + ELF (in-process) + ld.lld": b - isa,
            "of which ld.lld (child process)": lld,
        }
    steps["FlyDSL after compile (cache record, ir text)"] = c_called - timed.left
    steps["worker: code object + launch record read back"] = c_end - c_called
    total = sum(v for k, v in steps.items() if k != "ld.lld (child process)")
    return {"steps": steps, "binary_split": split, "passes": timed.passes,
            "total_cpu": total, "code_sha256": hashlib.sha256(code).hexdigest()}


def package_of(filename: str) -> str:
    f = filename.replace("\\", "/")
    for marker, name in (("/flydsl/expr/", "flydsl.expr"), ("/flydsl/compiler/", "flydsl.compiler"),
                         ("/flydsl/_mlir/", "flydsl._mlir (bindings)"), ("/flydsl/", "flydsl (other)"),
                         ("/mori/", "mori"), ("/torch/", "torch"), ("/gemmar_aot", "gemmar_aot"),
                         ("/kernels/", "kernels (recipes)")):
        if marker in f:
            return name
    if f.startswith("~") or f == "" or "{" in f:
        return "builtins / C extensions"
    if "/lib/python3" in f:
        return "python stdlib"
    return "other"


def profile_tables(prof: cProfile.Profile, top: int) -> dict:
    st = pstats.Stats(prof)
    rows = []
    by_pkg: dict[str, float] = defaultdict(float)
    for (filename, line, func), (cc, nc, tt, ct, _callers) in st.stats.items():
        rows.append({"function": f"{Path(filename).name}:{line}({func})" if line else func,
                     "package": package_of(filename), "calls": nc, "own_s": round(tt, 4), "cum_s": round(ct, 4)})
        by_pkg[package_of(filename)] += tt
    rows.sort(key=lambda r: -r["own_s"])
    total = sum(by_pkg.values())
    cum = sorted(rows, key=lambda r: -r["cum_s"])
    return {"profiled_total_s": round(total, 3),
            "top_own": rows[:top],
            "top_cumulative": [r for r in cum if r["cum_s"] < total * 0.999][:top],
            "by_package": {k: round(v, 3) for k, v in sorted(by_pkg.items(), key=lambda kv: -kv[1])}}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--manifest", default=str(ROOT / "manifests" / "dsv4-pro-wo_b.toml"))
    ap.add_argument("--gemm", type=int, default=0, help="which GEMM of the manifest's plan (build order)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--no-split-binary", action="store_true",
                    help="skip the extra format=llvm/isa runs that split gpu-module-to-binary")
    ap.add_argument("--json-out")
    args = ap.parse_args()

    load0 = os.getloadavg()
    c0 = time.process_time()
    from gemmar_aot.compiler import worker

    worker.init(None, False)
    init_cpu = time.process_time() - c0
    import flydsl
    import flydsl.compiler.jit_function as jf

    from gemmar_aot.builder.manifest import load_manifest
    from gemmar_aot.builder.plan import make_plan

    plan = make_plan(load_manifest(args.manifest))
    spec = [s for s in plan.specs if s.kind == "gemm"][args.gemm]

    c = time.process_time()
    ref = hashlib.sha256(worker.compile_kernel(spec).code).hexdigest()
    warm_cpu = time.process_time() - c
    c = time.process_time()
    again = hashlib.sha256(worker.compile_kernel(spec).code).hexdigest()
    plain_cpu = time.process_time() - c

    rounds = []
    for i in range(args.rounds):
        r = one_round(worker, spec, jf, split_binary=not args.no_split_binary)
        rounds.append(r)
        print(f"round {i + 1}/{args.rounds}: {r['total_cpu']:.2f} s CPU, load {os.getloadavg()[0]:.2f}",
              file=sys.stderr)
    prof = cProfile.Profile()
    profiled = one_round(worker, spec, jf, split_binary=False, profile=prof)
    digests = {ref, again, profiled["code_sha256"], *(r["code_sha256"] for r in rounds)}
    if len(digests) != 1:
        sys.exit(f"the timed compile produced different code objects: {sorted(digests)}")

    def med(vals):
        return round(statistics.median(vals), 4)

    steps = {k: med([r["steps"][k] for r in rounds]) for k in rounds[0]["steps"]}
    llvm_split = {k: med([r["binary_split"][k] for r in rounds]) for k in rounds[0]["binary_split"]}
    passes = []
    for j, row in enumerate(rounds[0]["passes"]):
        passes.append({**row, "seconds": med([r["passes"][j]["seconds"] for r in rounds])})
    result = {
        "manifest": Path(args.manifest).name,
        "spec": spec.param_dict(),
        "spec_id": spec.spec_id,
        "code_sha256": ref,
        "byte_identical_all_rounds": True,
        "flydsl": getattr(flydsl, "__version__", "?"),
        "rounds": args.rounds,
        "worker_init_cpu": round(init_cpu, 3),
        "first_compile_cpu": round(warm_cpu, 3),
        "plain_compile_cpu": round(plain_cpu, 3),
        "timed_compile_cpu_median": med([r["total_cpu"] for r in rounds]),
        "steps_cpu_median": steps,
        "gpu_module_to_binary_split": llvm_split,
        "mlir_pass_timing_wall_median": passes,
        "cprofile": profile_tables(prof, args.top),
        "cprofile_round_cpu": round(profiled["total_cpu"], 3),
        "loadavg_before": [round(x, 2) for x in load0],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "cpu_count": os.cpu_count(),
    }
    text = json.dumps(result, indent=2)
    if args.json_out:
        Path(args.json_out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json_out).write_text(text + "\n")
    print(text)


if __name__ == "__main__":
    main()
