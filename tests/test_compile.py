"""The real compiler: smoke.toml through mori's builders and FlyDSL, for gfx950.

These tests run FlyDSL (compile-only, no GPU) and take a few minutes on 2 cores.
The oracle for every kernel is the code object's own NT_AMDGPU_METADATA note;
the launch records come from FlyDSL's host IR and are checked against it.
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from gemmar_aot.model.codeobject import parse_code_object
from gemmar_aot.model.launch import PARAM_SIZES, LaunchRecord
from gemmar_aot.builder.manifest import load_manifest
from gemmar_aot.builder.plan import make_plan
from gemmar_aot.model.spec import KernelSpec

pytestmark = pytest.mark.compile

ROOT = Path(__file__).resolve().parent.parent
SMOKE = ROOT / "manifests" / "smoke.toml"


from conftest import smoke_kernels as _kernels  # noqa: E402


def test_smoke_builds_every_spec(smoke_build):
    summary, out = smoke_build
    plan = make_plan(load_manifest(SMOKE))
    assert summary["failures"] == []
    assert summary["compiled"] == len(plan.specs) and summary["hits"] == 0
    assert {s.spec_id for s, _, _ in _kernels(out)} == {s.spec_id for s in plan.specs if s.recipe not in ("hipcc", "jitv2")}


def test_unchanged_manifest_rebuilds_with_zero_compiles(smoke_build):
    from gemmar_aot.builder.pipeline import run_build

    summary, out = smoke_build
    lock = (out / "locks" / "smoke.lock.json").read_bytes()
    again = run_build(SMOKE, store=out, jobs=2, progress=False)
    assert again["compiled"] == 0 and again["misses"] == 0
    assert again["hits"] == summary["distinct_specs"]
    assert (out / "locks" / "smoke.lock.json").read_bytes() == lock  # deterministic


def test_code_objects_are_gfx950_v6_and_self_contained(smoke_build):
    _, out = smoke_build
    n = 0
    for spec, rec, code in _kernels(out):
        co = parse_code_object(code)
        assert (co.arch, co.mach, co.code_object_version) == ("gfx950", 0x04F, 6), spec.label()
        assert co.target.endswith("gfx950"), co.target
        assert co.undefined_symbols == (), (spec.label(), co.undefined_symbols)
        assert len(co.kernels) == 1
        assert co.kernels[0].to_json() == rec["metadata"]
        n += 1
    assert n > 0


def test_launch_record_matches_metadata(smoke_build):
    """kernarg size and every explicit argument's offset/size agree with the note."""
    _, out = smoke_build
    for spec, rec, code in _kernels(out):
        kernel = parse_code_object(code).kernel()
        launch = LaunchRecord.from_json(rec["launch"])
        assert launch.kernel == kernel.name
        explicit = [a for a in kernel.args if not a.value_kind.startswith("hidden_")]
        assert len(explicit) == len(launch.kernel_arg_types), spec.label()
        off = 0
        for arg, ty in zip(explicit, launch.kernel_arg_types):
            size = PARAM_SIZES[ty]
            off = (off + size - 1) // size * size
            assert (arg.offset, arg.size) == (off, size), (spec.label(), arg, ty)
            assert (arg.value_kind == "global_buffer") == (ty == "ptr"), (spec.label(), arg, ty)
            off += size
        assert kernel.kernarg_size == launch.packed_size(), spec.label()


def test_grids_follow_the_op(smoke_build):
    _, out = smoke_build
    seen = set()
    for spec, rec, _ in _kernels(out):
        launch = LaunchRecord.from_json(rec["launch"])
        p = spec.param_dict()
        if spec.kind == "gemm":
            b = p["builder"]
            m = p["cfg"].get("m_pad") or 4096
            n = p["n"]
            values = []
            for a in launch.args:
                if a.kind == "tensor":
                    values.append((0x1000, 64))
                elif a.name == "c_m":
                    values.append(m)
                elif a.name == "c_n":
                    values.append(n)
                else:
                    values.append(0)
            grid, block, _ = launch.resolve(launch.host_params(values))
            assert grid == (math.ceil(m / b["BLOCK_M"]) * math.ceil(n / b["BLOCK_N"]), 1, 1)
            assert block == (512, 1, 1)
            seen.add("gemm")
        elif spec.kind == "gemv":
            cfg = p["config"]
            wg_rows = cfg["rows"] if cfg["ksplit"] else cfg["rows"] * cfg["waves"]
            n = p["n"]
            values = [(0x1000, 64) if a.kind == "tensor" else n if a.name == "c_n" else 1 for a in launch.args]
            grid, block, _ = launch.resolve(launch.host_params(values))
            assert grid == (math.ceil(n / wg_rows), 1, 1) and block == (cfg["waves"] * 64, 1, 1), spec.label()
            seen.add("gemv")
        else:
            assert launch.is_constant_launch(), spec.label()
            if spec.kind in ("drain", "gather", "scatter", "gather_barrier"):
                assert tuple(launch.block) == (64, 1, 1) and tuple(launch.grid) == (1, 1, 1)
                seen.add(spec.kind)
    assert {"gemm", "gemv", "drain", "gather", "scatter"} <= seen


def test_fused_gemm_does_not_spill(smoke_build):
    _, out = smoke_build
    fused = [(s, r) for s, r, _ in _kernels(out) if s.recipe == "fused-sdma" and s.kind == "gemm"]
    assert fused
    for spec, rec in fused:
        md = rec["metadata"]
        assert md["vgpr_spill_count"] == 0 and md["sgpr_spill_count"] == 0, spec.label()
        assert md["scratch_bytes"] == 0, spec.label()


_FRESH = textwrap.dedent(
    """
    import json, sys
    from gemmar_aot.compiler import worker
    from gemmar_aot.model.spec import KernelSpec
    args = json.loads(sys.argv[1])
    worker.init(None, args["debug_locations"])
    sys.stdout.buffer.write(worker.compile_kernel(KernelSpec.from_json(args["spec"])).code)
    """
)


def _compile_fresh(spec: KernelSpec, debug_locations: bool = False) -> bytes:
    arg = json.dumps({"spec": spec.to_json(), "debug_locations": debug_locations})
    proc = subprocess.run([sys.executable, "-c", _FRESH, arg], capture_output=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr.decode()[-3000:]
    return proc.stdout


def _smallest_fused_gemm(out: Path) -> tuple[KernelSpec, bytes]:
    cands = [(s, c) for s, _, c in _kernels(out) if s.recipe == "fused-sdma" and s.kind == "gemm"]
    return min(cands, key=lambda sc: (sc[0].param_dict()["builder"]["K"], sc[0].param_dict()["cfg"]["m_pad"], sc[0].rank))


def test_deterministic_across_fresh_processes(smoke_build):
    _, out = smoke_build
    spec, code = _smallest_fused_gemm(out)
    first = _compile_fresh(spec)
    second = _compile_fresh(spec)
    assert first == second == code


def test_debug_mode_does_not_change_bytes(smoke_build):
    """--debug-locations (source locations on, per-pass verifier on) emits the same bytes."""
    _, out = smoke_build
    spec, code = _smallest_fused_gemm(out)
    assert _compile_fresh(spec, debug_locations=True) == code


_MORI_PATH = textwrap.dedent(
    """
    # FlyDSL's normal path: mori's own builder calls as GemmAllReduceOp._compiled
    # makes them, FlyDSL defaults (source locations on), compile-only.
    import json, os, sys
    from gemmar_aot.toolchain import compile_env, import_mori_device, load_toolchain
    tc = load_toolchain()
    os.environ.update(compile_env(tc))
    import_mori_device(tc)
    import flydsl.compiler as flyc
    import flydsl.expr as fx
    from mori.ops.gemm_ar.op import _build_cfg
    from mori.ops.gemm_ar.kernels_fused import compile_fused_gemm_scatter
    from mori.ops.gemm_ar.kernels_sdma import build_sdma_phases
    from gemmar_aot.compiler.worker import _code_object_bytes
    from gemmar_aot_kernels._common import gemm_placeholders
    a = json.loads(sys.argv[1])
    cfg = _build_cfg(world_size=a["world"], m_pad=a["m"], n=a["n"], block_m=128,
                     gather_dtype="bf16", gather_transport="lsa", counter_capacity=8,
                     shape_slots=a["slots"], shape_index=a["slot"], capacity_m=a["m_max"])
    gemm = compile_fused_gemm_scatter(cfg, a["rank"], K=a["k"], BLOCK_M=128, BLOCK_N=256,
        b_preshuffled=True, fuse=True, transport="sdma", quant="blockscale", sdma_queues=1,
        swap_ab=True, permlane=True, lane_transpose=True)
    flyc.compile(gemm, *gemm_placeholders(m=a["m"], n=a["n"], k=a["k"], quant="blockscale"),
                 stream=fx.Stream(None))
    parts = build_sdma_phases(cfg, a["rank"], queues=1)
    flyc.compile(parts["drain"], 0, 0, stream=fx.Stream(None))
    out = {"gemm": _code_object_bytes(gemm._last_compiled[1]._ir_text).hex(),
           "drain": _code_object_bytes(parts["drain"]._last_compiled[1]._ir_text).hex()}
    print(json.dumps(out))
    """
)


def test_equivalent_to_mori_builder_path(smoke_build):
    """Our GEMM and (canonical, deduplicated) drain equal mori's own compile of the op config."""
    _, out = smoke_build
    spec, code = _smallest_fused_gemm(out)
    cfg = spec.param_dict()["cfg"]
    args = {"world": cfg["world_size"], "m": cfg["m_pad"], "n": cfg["n"], "k": spec.param_dict()["builder"]["K"],
            "slots": cfg["shape_slots"], "slot": cfg["shape_index"], "m_max": cfg["capacity_m"], "rank": spec.rank}
    proc = subprocess.run([sys.executable, "-c", _MORI_PATH, json.dumps(args)], capture_output=True,
                          text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    assert bytes.fromhex(theirs["gemm"]) == code
    drains = [c for s, _, c in _kernels(out) if s.kind == "drain" and s.rank == spec.rank
              and s.param_dict()["cfg"]["world_size"] == cfg["world_size"]]
    assert drains == [bytes.fromhex(theirs["drain"])]


_FUSED_LSA_PHASES = textwrap.dedent(
    """
    # fused-lsa's tail as mori's benchmark builds it: every phase from ONE call with
    # reduce_self_from_recv=True and recv_uncached=True. Ours shares drain and gather with
    # fused-sdma (built with False; neither reads those options).
    import json, os, sys
    from gemmar_aot.toolchain import compile_env, import_mori_device, load_toolchain
    tc = load_toolchain()
    os.environ.update(compile_env(tc))
    import_mori_device(tc)
    import flydsl.compiler as flyc
    import flydsl.expr as fx
    from mori.ops.gemm_ar.op import _build_cfg
    from mori.ops.gemm_ar.kernels_sdma import build_sdma_phases
    from gemmar_aot.compiler.worker import _code_object_bytes
    a = json.loads(sys.argv[1])
    cfg = _build_cfg(**a["cfg"])
    parts = build_sdma_phases(cfg, a["rank"], queues=1, reduce_self_from_recv=True, recv_uncached=True)
    out = {}
    for phase in parts["fused_order"]:
        flyc.compile(parts[phase], 0, 0, stream=fx.Stream(None))
        out[phase] = _code_object_bytes(parts[phase]._last_compiled[1]._ir_text).hex()
    print(json.dumps(out))
    """
)


def test_fused_lsa_tail_equals_one_builder_call(smoke_build):
    """Sharing fused-sdma's drain and gather with fused-lsa changes no byte of fused-lsa's tail."""
    _, out = smoke_build
    plan = make_plan(load_manifest(SMOKE))
    (t,) = [t for t in plan.tuples if t.workload.transport == "fused-lsa"]
    rank = t.ranks[-1]
    tail = rank.launches[1:]
    cfg = dict(tail[1].param_dict()["cfg"])  # the reduce's: the tuple's own config
    cfg.pop("via")
    proc = subprocess.run([sys.executable, "-c", _FUSED_LSA_PHASES, json.dumps({"cfg": cfg, "rank": rank.rank})],
                          capture_output=True, text=True, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-3000:]
    theirs = json.loads(proc.stdout.strip().splitlines()[-1])
    codes = {s.spec_id: c for s, _, c in _kernels(out)}
    assert [s.kind for s in tail] == list(theirs)
    for s in tail:
        assert codes[s.spec_id] == bytes.fromhex(theirs[s.kind]), s.label()
