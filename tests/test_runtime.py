"""The serving runtime (gemmar_aot.runtime) against the real smoke artifacts, with the two fakes.

The kernels are the real code objects compiled from manifests/smoke.toml (world 2,
N 1024, K 256/512, M 256/512 sharing a window of m_max 512). ``FakeHipDriver``
parses each one and checks every launch against the lock's launch records;
``FakeCommunicator`` backs the window with host memory. Nothing executes.

Set GEMMAR_AOT_TEST_SMOKE_STORE to an already-built smoke store to skip the
session build.
"""

from __future__ import annotations

import copy
import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from fakes import FakeCommunicator, FakeHipDriver, InjectedFailure
from lock_docs import drop_rank, keep_tuples, kernel_entry, part, rank_launches
from gemmar_aot.model.layout import window_layout
from gemmar_aot.model import rules
from gemmar_aot.runtime import (
    ArtifactConflictError,
    ArtifactMismatchError,
    ArtifactMissingError,
    ArtifactNotFoundError,
    GemmAllReduceOp,
    SelfTestError,
    load_artifacts,
    supports,
    window_bytes_for,
)
from gemmar_aot.model.lock import read_lock
from gemmar_aot.store import CorruptArtifactError, Store
from gemmar_aot.model.bundle import LockBundle

ROOT = Path(__file__).resolve().parent.parent
N, K, WORLD = 1024, 256, 2
FP8 = torch.float8_e4m3fn




def _lock(smoke_lock) -> dict:
    """A fresh, editable copy of the lock's JSON data (artifacts= validates it like a file)."""
    return smoke_lock.to_json()


def make_op(store, lock, *, rank=0, comm=None, driver=None, k=K, **kw):
    comm = comm or FakeCommunicator(rank=rank, nranks=WORLD)
    driver = driver or FakeHipDriver([lock])
    kw.setdefault("self_test", False)
    kw.setdefault("artifacts", store)
    op = GemmAllReduceOp(comm, n=N, k=k, m_max=512, driver=driver, **kw)
    return op, comm, driver


def operands(m, k=K, *, a_scale_form="kb_m"):
    a = torch.zeros(m, k, dtype=FP8)
    b = torch.zeros(N, k, dtype=FP8)
    kb = k // 128
    if a_scale_form == "kb_m":
        a_scale = torch.ones(kb, m)
    elif a_scale_form == "flat":
        a_scale = torch.ones(kb * m)
    elif a_scale_form == "m_kb_colmajor":
        a_scale = torch.ones(kb, m).t()
    else:
        a_scale = torch.ones(m, kb)
    b_scale = torch.ones(N // 128, kb)
    return a, b, a_scale, b_scale


def tuple_entry(lock, *, m, k=K, gather_dtype="bf16", rank=0):
    """(LockTuple, RankLaunches) of a typed lock, or (tuple, rank) dicts of its JSON data."""
    if isinstance(lock, dict):
        for ti, t in enumerate(lock["tuples"]):
            if (t["transport"], t["m"], t["k"], t["gather_dtype"]) == ("fused-sdma", m, k, gather_dtype):
                return t, rank_launches(lock, ti, rank)
        raise KeyError(m)
    for t in lock.tuples:
        if (t.id.transport, t.id.m, t.id.k, t.id.gather_dtype) == ("fused-sdma", m, k, gather_dtype):
            return t, next(r for r in t.ranks if r.rank == rank)
    raise KeyError(m)


def kernel_json(doc, key) -> dict:
    """The editable kernel entry (and, under "launch", a private copy of its launch record) of ``key``."""
    k = kernel_entry(doc, key)
    if isinstance(k["launch"], int):  # give it its own launch record, so an edit reaches only this kernel
        doc["launch_records"].append(copy.deepcopy(doc["launch_records"][k["launch"]]))
        k["launch"] = len(doc["launch_records"]) - 1
    return k


# ---------------------------------------------------------------------------
# import rule
# ---------------------------------------------------------------------------

FORBIDDEN = ("flydsl", "mlir", "_mlir_libs", "mori.ops", "gemmar_aot.compiler", "gemmar_aot.toolchain",
             "gemmar_aot_kernels", "gemmar_aot.compiler.keys", "gemmar_aot.builder")


def _fresh_modules(code: str) -> set[str]:
    out = subprocess.run([sys.executable, "-c", code + "\nimport sys, json; print(json.dumps(sorted(sys.modules)))"],
                         capture_output=True, text=True, cwd=ROOT, timeout=120,
                         env={**os.environ, "PYTHONPATH": str(ROOT / "tests")})
    assert out.returncode == 0, out.stderr
    return set(json.loads(out.stdout.strip().splitlines()[-1]))


def _forbidden(mods: set[str]) -> list[str]:
    return sorted(m for m in mods if any(m == f or m.startswith(f + ".") for f in FORBIDDEN))


def test_import_rule_fresh_interpreter():
    mods = _fresh_modules("import gemmar_aot.runtime, gemmar_aot.runtime.coverage, gemmar_aot.runtime.hip, "
                          "gemmar_aot.runtime.kernel_checks, gemmar_aot.runtime.launches, gemmar_aot.runtime.loading, "
                          "gemmar_aot.runtime.memory, gemmar_aot.runtime.operands")
    assert _forbidden(mods) == []
    assert "torch" not in mods, "torch must be imported lazily"
    assert not any(m == "mori" or m.startswith("mori.") for m in mods)
    # the probe itself can see a violation
    assert _forbidden({"flydsl.expr", "gemmar_aot.compiler.keys"}) == ["flydsl.expr", "gemmar_aot.compiler.keys"]


def test_import_rule_holds_through_construction_and_calls(smoke_store):
    code = textwrap.dedent(f"""
        import torch
        from fakes import FakeCommunicator, FakeHipDriver
        from gemmar_aot.runtime import GemmAllReduceOp
        from gemmar_aot.model.lock import read_lock
        lock = read_lock({str(smoke_store / 'locks' / 'smoke.lock.json')!r})
        op = GemmAllReduceOp(FakeCommunicator(), n=1024, k=256, m_max=512, artifacts={str(smoke_store)!r},
                             driver=FakeHipDriver([lock]), self_test=False)
        op(torch.zeros(256, 256, dtype=torch.float8_e4m3fn), torch.zeros(1024, 256, dtype=torch.float8_e4m3fn),
           torch.ones(2, 256), torch.ones(16))
        op.close()
    """)
    mods = _fresh_modules(code)
    assert _forbidden(mods) == []
    assert not any(m == "mori" or m.startswith("mori.") for m in mods)  # mori.cco only for a mori communicator


# ---------------------------------------------------------------------------
# finding artifacts
# ---------------------------------------------------------------------------


def test_artifacts_from_lock_path_directory_and_pair(smoke_store, smoke_lock):
    lock_path = smoke_store / "locks" / "smoke.lock.json"
    for spec in (lock_path, str(smoke_store), (lock_path, smoke_store), (smoke_lock, smoke_store),
                 [lock_path, smoke_store]):  # the same lock twice merges without conflict
        arts = load_artifacts(spec)
        key = next(k for k in arts.index if k.transport == "fused-sdma" and k.k == 256 and k.gather_dtype == "bf16")
        assert arts.m_values(key) == (256, 512)
        assert arts.m_values(key, rank=1) == (256, 512)
        assert key.gather_transport is None  # bf16: the transport means nothing
    assert load_artifacts(arts) is arts
    two_dirs = load_artifacts((smoke_store, str(smoke_store)))  # two sources, not a (lock, root) pair
    assert len(two_dirs.sources) == 2


def test_artifacts_from_a_lock_dict_use_the_default_store(smoke_store, smoke_lock, monkeypatch):
    monkeypatch.setenv("GEMMAR_AOT_STORE", str(smoke_store))
    arts = load_artifacts(smoke_lock)
    assert arts.sources[0].store_root == smoke_store and arts.sources[0].lock_path is None
    with pytest.raises(TypeError, match="artifacts= must be"):
        load_artifacts(42)


def test_artifacts_from_env_list(smoke_store, monkeypatch, tmp_path):
    lock_path = smoke_store / "locks" / "smoke.lock.json"
    monkeypatch.setenv("GEMMAR_AOT_ARTIFACTS", os.pathsep.join([str(lock_path), str(smoke_store)]))
    arts = load_artifacts(None)
    assert len(arts.sources) == 2 and all("GEMMAR_AOT_ARTIFACTS" in s.origin for s in arts.sources)
    monkeypatch.setenv("GEMMAR_AOT_ARTIFACTS", str(tmp_path))  # a directory with no locks
    with pytest.raises(ArtifactNotFoundError, match="holds no lock files"):
        load_artifacts(None)


def test_artifacts_from_entry_points(smoke_store, monkeypatch, tmp_path):
    import importlib.metadata as md

    (tmp_path / "gemmar_test_artpkg.py").write_text(textwrap.dedent(f"""
        def locate():
            return ({str(smoke_store / 'locks' / 'smoke.lock.json')!r}, {str(smoke_store)!r})
        def locate_dir():
            return {str(smoke_store)!r}
    """))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delenv("GEMMAR_AOT_ARTIFACTS", raising=False)
    eps = [md.EntryPoint("a", "gemmar_test_artpkg:locate", "gemmar_aot.artifacts"),
           md.EntryPoint("b", "gemmar_test_artpkg:locate_dir", "gemmar_aot.artifacts")]
    seen = {}

    def fake_entry_points(**kw):
        seen.update(kw)
        return eps if kw.get("group") == "gemmar_aot.artifacts" else []

    monkeypatch.setattr(md, "entry_points", fake_entry_points)
    arts = load_artifacts(None)
    assert seen == {"group": "gemmar_aot.artifacts"}
    assert [s.origin.split(" =")[0] for s in arts.sources] == ["entry point a", "entry point b"]
    monkeypatch.setattr(md, "entry_points", lambda **kw: [])
    with pytest.raises(ArtifactNotFoundError, match="GEMMAR_AOT_ARTIFACTS"):
        load_artifacts(None)


def test_conflicting_sources_name_both(smoke_store, smoke_lock):
    other = _lock(smoke_lock)
    _t, r = tuple_entry(other, m=256)
    kernels = part(other, 0)["kernels"]
    kernels["f" * 64] = kernels[r["launches"][0]]
    r["launches"][0] = "f" * 64
    with pytest.raises(ArtifactConflictError) as ei:
        load_artifacts([smoke_store / "locks" / "smoke.lock.json", (other, smoke_store)])
    msg = str(ei.value)
    assert "M=256 rank 0" in msg and "smoke.lock.json" in msg and "<lock dict>" in msg


# ---------------------------------------------------------------------------
# construction
# ---------------------------------------------------------------------------


def test_construct_acquires_in_order_and_zeroes_the_window(smoke_store, smoke_lock):
    op, comm, drv = make_op(smoke_store, smoke_lock, sdma_queues=1)
    assert op.m_values == (256, 512)
    assert op.window_bytes == window_bytes_for(WORLD, m_max=512, n=N) == 3675904
    assert comm.acquired == {"mem": 1, "window": 1, "dev_comm": 1} and comm.barriers == 1
    assert drv.memsets == [(op.mem.ptr, 0, op.window_bytes)]
    reqs = comm.dev_comm_requests[0]
    assert (reqs.gda_signal_count, reqs.gda_counter_count, reqs.sdma_queue_count) == (0, 0, 1)
    # each distinct blob loaded once: 2 GEMMs + drain + 2 reduce + 2 gather + scatter + self-test reduce
    lock_blobs = set()
    for m in (256, 512):
        _t, r = tuple_entry(smoke_lock, m=m)
        lock_blobs |= {e.blob.hash for e in r.launches + r.self_test}
    assert drv.counters["load_module"] == len(lock_blobs) == len(drv.loaded)
    assert drv.counters["get_function"] == len(lock_blobs)
    op.close()
    assert not drv.loaded and comm.live_counts == {"dev_comm": 1}  # the dev comm is the communicator's
    assert comm.closed_order == ["window", "mem"]


def test_window_bytes_for_matches_the_spec():
    assert window_bytes_for(8, m_max=16384, n=7168) == 734013440
    assert window_bytes_for(8, m_max=16384, n=7168, gather_dtype="fp8") == 851519488
    assert window_bytes_for(2, m_max=1024, n=1024, max_shapes=4) == 7346048
    assert GemmAllReduceOp.window_bytes_for(2, m_max=1024, n=1024, max_shapes=4) == 7346048


@pytest.mark.parametrize("kw, match", [
    (dict(quant="ptpc"), "quant"),
    (dict(quant="mxfp8", block_m=128), "block_m = 256"),
    (dict(gather_dtype="fp16"), "gather_dtype"),
    (dict(gather_transport="nvlink"), "gather_transport"),
    (dict(block_n=512), "block_n"),
    (dict(block_m=192), "multiple of 128"),
    (dict(sdma_queues=0), "sdma_queues"),
    (dict(max_shapes=0), "max_shapes"),
    (dict(k=200), "K must be a multiple of 128"),
    (dict(k=128), "at least 256"),
])
def test_constructor_rules_refuse_before_acquiring(smoke_store, smoke_lock, kw, match):
    comm, drv = FakeCommunicator(), FakeHipDriver([smoke_lock])
    with pytest.raises(ValueError, match=match):
        make_op(smoke_store, smoke_lock, comm=comm, driver=drv, **kw)
    assert not comm.acquired and not drv.counters


def test_m_max_and_max_shapes_must_match_the_artifacts(smoke_store, smoke_lock):
    comm, drv = FakeCommunicator(), FakeHipDriver([smoke_lock])
    with pytest.raises(ArtifactMismatchError, match="built for m_max 512.*pads m_max to 1024"):
        GemmAllReduceOp(comm, n=N, k=K, m_max=1000, driver=drv, artifacts=smoke_store, self_test=False)
    with pytest.raises(ArtifactMismatchError, match="max_shapes 2"):
        GemmAllReduceOp(comm, n=N, k=K, m_max=512, max_shapes=4, driver=drv, artifacts=smoke_store,
                        self_test=False)
    # m_max pads the same way mori pads it: 300 -> 512 is the artifacts' window
    op = GemmAllReduceOp(comm, n=N, k=K, m_max=300, driver=drv, artifacts=smoke_store, self_test=False)
    assert op.m_max == 512
    op.close()
    assert comm.acquired == {"mem": 1, "window": 1, "dev_comm": 1}


def test_nothing_built_for_this_shape(smoke_store, smoke_lock):
    comm = FakeCommunicator()
    with pytest.raises(ArtifactMissingError, match="no kernels for fused-sdma N=1024 K=384") as ei:
        make_op(smoke_store, smoke_lock, comm=comm, k=384)
    assert "k = 384" in ei.value.manifest_lines
    assert not comm.acquired


def test_arch_mismatch_is_refused(smoke_store, smoke_lock):
    comm, drv = FakeCommunicator(), FakeHipDriver([smoke_lock], arch="gfx942:sramecc+:xnack-")
    with pytest.raises(ArtifactMismatchError, match="compiled for gfx950.*gfx942"):
        make_op(smoke_store, smoke_lock, comm=comm, driver=drv)
    assert not comm.acquired and drv.counters["load_module"] == 0
    # the feature suffix is not part of the comparison
    op, _c, _d = make_op(smoke_store, smoke_lock, driver=FakeHipDriver([smoke_lock], arch="gfx950:xnack+"))
    op.close()


def test_corrupt_blob_is_refused_naming_its_path(smoke_store, smoke_lock, tmp_path):
    copy_root = tmp_path / "store"
    shutil.copytree(smoke_store, copy_root)
    LockBundle(copy_root / "locks" / "smoke.lock.json").blob_index.unlink()  # the store serves every code object
    _t, r = tuple_entry(smoke_lock, m=512)
    digest = r.launches[0].blob.hash
    path = Store(copy_root).blob_path(digest)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    path.write_bytes(bytes(data))
    comm, drv = FakeCommunicator(), FakeHipDriver([smoke_lock])
    with pytest.raises(CorruptArtifactError) as ei:
        make_op(copy_root, smoke_lock, comm=comm, driver=drv)
    assert ei.value.path == path and str(path) in str(ei.value)
    assert drv.counters["load_module"] == 0 and not comm.acquired  # nothing loaded, nothing acquired


def test_layout_differing_across_m_is_refused(smoke_store, smoke_lock):
    lock = _lock(smoke_lock)
    t, _r = tuple_entry(lock, m=512)
    t["layout"]["output_off"] += 128
    comm, drv = FakeCommunicator(), FakeHipDriver([smoke_lock])
    with pytest.raises(ArtifactMismatchError, match=r"differ between M=256 .* and M=512 .*'output_off'"):
        make_op((lock, smoke_store), smoke_lock, comm=comm, driver=drv, artifacts=(lock, smoke_store))
    assert not comm.acquired and drv.counters["load_module"] == 0


def test_layout_not_matching_the_rules_is_refused(smoke_store, smoke_lock):
    lock = _lock(smoke_lock)
    t, _r = tuple_entry(lock, m=512)
    t["layout"]["call"]["counter_off"] += 64  # a per-M field: only the recomputation catches it
    comm = FakeCommunicator()
    with pytest.raises(ArtifactMismatchError, match=r"M=512 is not the one this runtime computes.*counter_off"):
        make_op(None, smoke_lock, comm=comm, artifacts=(lock, smoke_store))
    assert not comm.acquired


@pytest.mark.parametrize("field, value, match", [
    ("kernel", "not_the_kernel", "the launch record names 'not_the_kernel'"),
    # the lock's record edited alone no longer matches the store's record it names (the code object
    # check behind it is tested with a consistent record in tests/test_kernel_checks.py)
    ("kernel_arg_types", ["ptr", "len32"] * 5 + ["i32", "i32", "i64", "i32"],
     r"the lock and the store disagree about gemm for M=256 rank 0 .*the lock's launch record is not the record's"),
])
def test_code_object_must_match_its_launch_record(smoke_store, smoke_lock, field, value, match):
    lock = _lock(smoke_lock)
    _t, r = tuple_entry(lock, m=256)
    k = kernel_json(lock, r["launches"][0])
    if field == "kernel":  # the kernel symbol travels with the entry, not in the shared launch record
        k["symbol"] = value
    else:
        lock["launch_records"][k["launch"]][field] = value
    comm, drv = FakeCommunicator(), FakeHipDriver([smoke_lock])
    with pytest.raises(ArtifactMismatchError, match=match):
        make_op(None, smoke_lock, comm=comm, driver=drv, artifacts=(lock, smoke_store))
    assert drv.counters["load_module"] == 0 and not comm.acquired


@pytest.mark.parametrize("step", ["alloc_mem", "register_window", "create_dev_comm", "barrier"])
def test_failure_rolls_back_everything_acquired(smoke_store, smoke_lock, step):
    comm, drv = FakeCommunicator(fail_at={step}), FakeHipDriver([smoke_lock])
    with pytest.raises(InjectedFailure, match=step):
        make_op(smoke_store, smoke_lock, comm=comm, driver=drv)
    assert comm.live_counts.get("mem", 0) == comm.live_counts.get("window", 0) == 0
    assert comm.released["mem"] == comm.acquired["mem"] and comm.released["window"] == comm.acquired["window"]
    if comm.acquired["window"]:
        assert comm.closed_order == ["window", "mem"]
    assert drv.counters["load_module"] > 0 and not drv.loaded  # every module unloaded again


def test_failed_self_test_at_construction_rolls_back(smoke_store, smoke_lock):
    comm, drv = FakeCommunicator(), FakeHipDriver([smoke_lock])
    with pytest.raises(SelfTestError):
        make_op(smoke_store, smoke_lock, comm=comm, driver=drv, self_test=True)
    assert not comm.live_counts.get("mem") and not comm.live_counts.get("window") and not drv.loaded


def test_no_hip_runtime_is_a_clear_error(smoke_store, smoke_lock):
    # In a fresh interpreter: this one may hold the HIP test double (tests/hipstub), which
    # answers to libamdhip64.so.7 once loaded.
    code = textwrap.dedent(f"""
        from fakes import FakeCommunicator
        from gemmar_aot.runtime import GemmAllReduceOp, HipError
        from gemmar_aot.runtime.hip import HipDriver
        try:
            HipDriver()
        except HipError as exc:
            assert "libamdhip64.so" in str(exc) and "driver=" in str(exc), exc
        else:
            print("SKIP")
            raise SystemExit(0)
        comm = FakeCommunicator()
        try:
            GemmAllReduceOp(comm, n={N}, k={K}, m_max=512, artifacts={str(smoke_store)!r})
        except HipError:
            pass
        else:
            raise AssertionError("constructed without a HIP runtime")
        assert not comm.acquired
        print("OK")
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=300,
                         env={**os.environ, "PYTHONPATH": str(ROOT / "tests")})
    assert out.returncode == 0, out.stderr
    if out.stdout.strip() == "SKIP":
        pytest.skip("this machine has a HIP runtime")
    assert out.stdout.strip() == "OK"


# ---------------------------------------------------------------------------
# calls
# ---------------------------------------------------------------------------


def _expected_gemm_args(op, m, a, b, a_scale, b_scale):
    lay = op._entries[m].layout
    kb = op.k // 128
    return (a.data_ptr(), m * op.k, b.data_ptr(), N * op.k, op.mem.ptr + lay.input_off, m * N,
            a_scale.data_ptr(), m * kb, b_scale.data_ptr(), (N // 128) * kb, m, N, op.dev_comm.ptr,
            op.win.handle)


@pytest.mark.parametrize("rank", [0, 1])
def test_m_sequence_uses_each_m_own_kernels_and_slot(smoke_store, smoke_lock, rank, monkeypatch):
    from gemmar_aot.runtime import driver as driver_mod

    op, _comm, drv = make_op(smoke_store, smoke_lock, rank=rank)
    made = []
    real_init = driver_mod.KernArgs.__init__
    monkeypatch.setattr(driver_mod.KernArgs, "__init__", lambda self, size: made.append(size) or real_init(self, size))
    addresses = {}
    for m in (256, 512, 256):
        drv.clear()
        a, b, a_scale, b_scale = operands(m)
        out = op(a, b, a_scale, b_scale)
        t, r = tuple_entry(smoke_lock, m=m, rank=rank)
        assert [l.digest for l in drv.launches] == [e.blob.hash for e in r.launches]
        drv.assert_roles(["gemm", "drain", "reduce", "gather"])
        gemm = drv.launches[0]
        assert gemm.kernel.endswith(f"_r{rank}") and gemm.kernel == r.launches[0].symbol
        assert gemm.grid == ((m // 128) * (N // 256), 1, 1) and gemm.block == (512, 1, 1)
        assert gemm.args == _expected_gemm_args(op, m, a, b, a_scale, b_scale)
        assert drv.launches[2].grid == (m * N * 2 // 16 // WORLD // 512, 1, 1)  # the reduce
        for phase in drv.launches[1:]:
            assert phase.args == (op.dev_comm.ptr, op.win.handle)
        assert all(l.stream == drv.stream for l in drv.launches)
        # the M's own counter slot, as compiled in (deterministic: bands - 1)
        assert t.layout.call.slot == op.counter_slot(m) == rules.counter_slot(m, WORLD, 128) == m // 256 - 1
        assert t.layout.call.counter_off == 5504 + op.counter_slot(m) * WORLD * 8 * 4
        # the output view is the window's output region
        lay = t.layout
        assert out.shape == (m, N) and out.dtype == torch.bfloat16
        assert out.data_ptr() == op.mem.ptr + lay.output_off
        # the GEMM's argument buffer is this M's, packed in place: same buffer every call
        addresses.setdefault(m, id(op._plans[m].gemm.args))
        assert id(op._plans[m].gemm.args) == addresses[m]
    assert not drv.syncs and not drv.memsets[1:]  # no host sync, no memset on the hot path
    assert made == []  # no argument buffer is made per call
    op.close()


def test_two_ops_on_one_communicator(smoke_store, smoke_lock):
    comm, drv = FakeCommunicator(), FakeHipDriver([smoke_lock])
    op1, _, _ = make_op(smoke_store, smoke_lock, comm=comm, driver=drv, k=256)
    op2, _, _ = make_op(smoke_store, smoke_lock, comm=comm, driver=drv, k=512)
    assert comm.acquired == {"mem": 2, "window": 2, "dev_comm": 2}
    lo1, lo2 = op1.mem.ptr, op2.mem.ptr
    assert lo1 + op1.window_bytes <= lo2 or lo2 + op2.window_bytes <= lo1  # disjoint windows
    assert op1.win.handle != op2.win.handle
    for op, k in ((op1, 256), (op2, 512)):
        drv.clear()
        a, b, a_scale, b_scale = operands(512, k)
        op(a, b, a_scale, b_scale)
        assert drv.launches[0].args == _expected_gemm_args(op, 512, a, b, a_scale, b_scale)
        assert f"_k{k}_" in drv.launches[0].kernel
    op1.close()
    drv.clear()
    op2(*operands(256, 512))
    assert len(drv.launches) == 4
    with pytest.raises(RuntimeError, match="closed"):
        op1(*operands(256))
    op2.close()


def test_accepted_a_scale_forms_pass_their_own_storage(smoke_store, smoke_lock):
    op, _c, drv = make_op(smoke_store, smoke_lock)
    for form in ("kb_m", "flat", "m_kb_colmajor"):
        drv.clear()
        a, b, a_scale, b_scale = operands(256, a_scale_form=form)
        op(a, b, a_scale, b_scale)
        assert drv.launches[0].args[6] == a_scale.data_ptr()  # no copy, the kb-major storage itself
    op.close()


def test_non_contiguous_a_is_made_contiguous(smoke_store, smoke_lock):
    op, _c, drv = make_op(smoke_store, smoke_lock)
    a, b, a_scale, b_scale = operands(256)
    a_nc = torch.zeros(K, 256, dtype=FP8).t()
    assert not a_nc.is_contiguous()
    op(a_nc, b, a_scale, b_scale)
    assert drv.launches[0].args[0] != a_nc.data_ptr()
    op.close()


OPERAND_CASES = {
    "a bf16": (lambda a, b, s, t: (a.to(torch.bfloat16), b, s, t), "a_fp8 must be torch.float8_e4m3fn"),
    "a fnuz": (lambda a, b, s, t: (a.view(torch.uint8).view(torch.float8_e4m3fnuz), b, s, t),
               "float8_e4m3fnuz.*bias is 8.*4x too"),
    "b fnuz": (lambda a, b, s, t: (a, b.view(torch.uint8).view(torch.float8_e4m3fnuz), s, t), "b_preshuffled is"),
    "a wrong K": (lambda a, b, s, t: (torch.zeros(256, 512, dtype=FP8), b, s, t), r"a_fp8 must be \(256, 256\)"),
    "a 1-D": (lambda a, b, s, t: (a.view(-1)[:256], b, s, t), r"a_fp8 must be \(256, 256\), got \(256,\)"),
    "b wrong N": (lambda a, b, s, t: (a, torch.zeros(512, 256, dtype=FP8), s, t), r"b_preshuffled must be \(1024"),
    "a_scale int32": (lambda a, b, s, t: (a, b, s.to(torch.int32), t), "a_scale must be torch.float32"),
    "b_scale bf16": (lambda a, b, s, t: (a, b, s, t.to(torch.bfloat16)), "b_scale must be torch.float32"),
    "a_scale numel": (lambda a, b, s, t: (a, b, torch.ones(100), t), "a_scale must have 512 elements"),
    "b_scale numel": (lambda a, b, s, t: (a, b, s, torch.ones(3)), "b_scale must have 16 elements"),
    "a_scale row-major": (lambda a, b, s, t: (a, b, torch.ones(256, 2), t), "row-major, which is ambiguous"),
    "a_scale 3-D": (lambda a, b, s, t: (a, b, torch.ones(2, 16, 16), t), r"a_scale must be \[K/128, M\]"),
    "a_scale other shape": (lambda a, b, s, t: (a, b, torch.ones(4, 128), t), "matches neither"),
    "a other device": (lambda a, b, s, t: (torch.empty(256, 256, dtype=FP8, device="meta"), b, s, t),
                       "a_fp8 must be on the op's device cpu, got meta"),
    "b_scale other device": (lambda a, b, s, t: (a, b, s, torch.ones(8, 2, device="meta")),
                             "b_scale must be on the op's device"),
}


@pytest.mark.parametrize("case", sorted(OPERAND_CASES))
def test_operand_validation(smoke_store, smoke_lock, case):
    op, _c, drv = make_op(smoke_store, smoke_lock)
    mutate, match = OPERAND_CASES[case]
    with pytest.raises(ValueError, match=match):
        op(*mutate(*operands(256)))
    assert not drv.launches  # nothing launched on a rejected call
    op.close()


def test_m_rules_on_call(smoke_store, smoke_lock):
    op, _c, drv = make_op(smoke_store, smoke_lock)
    with pytest.raises(ValueError, match="exceeds the window's m_max=512"):
        op(*operands(768))
    with pytest.raises(ValueError, match="multiple of world_size \\* block_m = 256"):
        op(*operands(128))
    assert op.padded_m(1) == 256 and op.padded_m(257) == 512
    assert not drv.launches
    op.close()


def test_mxfp8_operand_rules():
    from gemmar_aot.runtime.operands import check_operands

    m, n, k = 256, 1024, 256
    a, b = torch.zeros(m, k, dtype=FP8), torch.zeros(n, k, dtype=FP8)
    a_scale = torch.zeros(m * k // 128, dtype=torch.int32)
    b_scale = torch.zeros((n // 32) * (k // 32), dtype=torch.int32)
    kw = dict(m=m, n=n, k=k, quant="mxfp8", device=torch.device("cpu"))
    out = check_operands(a, b, a_scale, b_scale, **kw)
    assert out[2].data_ptr() == a_scale.data_ptr()
    with pytest.raises(ValueError, match="flat buffer preshuffle_a_scale returns"):
        check_operands(a, b, a_scale.view(m, k // 128), b_scale, **kw)
    with pytest.raises(ValueError, match="a_scale must be torch.int32"):
        check_operands(a, b, a_scale.float(), b_scale, **kw)
    with pytest.raises(ValueError, match="b_scale must have 256 elements"):
        check_operands(a, b, a_scale, b_scale[:10], **kw)


# ---------------------------------------------------------------------------
# strict misses
# ---------------------------------------------------------------------------


def _without_m(lock, m):
    lock = _lock(lock)
    keep_tuples(lock, lambda t: not (t["transport"] == "fused-sdma" and t["k"] == K and t["m"] == m
                                     and t["gather_dtype"] == "bf16"))
    return lock


def test_strict_miss_names_m_nearest_and_manifest_lines(smoke_store, smoke_lock):
    from gemmar_aot.builder.manifest import parse_manifest
    from gemmar_aot.builder.plan import make_plan

    lock = _without_m(smoke_lock, 256)
    op, _c, drv = make_op(None, smoke_lock, artifacts=(lock, smoke_store))
    assert op.m_values == (512,)
    with pytest.raises(ArtifactMissingError) as ei:
        op(*operands(256))
    e = ei.value
    assert e.m == 256 and e.available == (512,) and e.nearest == (512,)
    msg = str(e)
    assert "M=256" in msg and "nearest: 512" in msg and "nothing is compiled" in msg
    assert e.manifest_lines in msg
    assert e.manifest_lines.splitlines() == [
        "[[tuple]]", 'transport = "fused-sdma"', "m = 256", "n = 1024", "k = 256", "world = 2",
        'quant = "blockscale"', 'gather_dtype = "bf16"', "m_max = 512"]
    assert not drv.launches
    # the lines are a valid manifest that builds exactly the missing M into the same window
    plan = make_plan(parse_manifest('[manifest]\nname = "x"\n\n' + e.manifest_lines, "x.toml"))
    (t,) = plan.tuples
    assert (t.workload.m, t.layout.m_max, t.layout.slot) == (256, 512, 0)
    assert t.layout.window == window_layout(2, 1024, 512, 128, "bf16", "lsa", 2, m_pad=256)
    # the op's own check is the same question supports() answers
    assert not supports(256, N, K, WORLD, artifacts=(lock, smoke_store))
    op.close()


def test_m_built_for_only_some_ranks_is_not_served(smoke_store, smoke_lock, caplog):
    lock = _lock(smoke_lock)
    t, _r = tuple_entry(lock, m=256)
    drop_rank(lock, lock["tuples"].index(t), 1)  # rank 1 lacks M=256
    with caplog.at_level(logging.WARNING, logger="gemmar_aot.runtime"):
        op, _c, drv = make_op(None, smoke_lock, rank=0, artifacts=(lock, smoke_store))
    assert op.m_values == (512,)  # rank 0 has M=256, but serving it alone would hang its peer
    assert any("[256] are built for only some" in r.getMessage() for r in caplog.records)
    with pytest.raises(ArtifactMissingError, match="M=256"):
        op(*operands(256))
    assert not drv.launches
    op.close()


def test_fp8_wire_miss_lists_the_wire(smoke_store, smoke_lock):
    op, _c, drv = make_op(smoke_store, smoke_lock, gather_dtype="fp8", gather_transport="lsa")
    assert op.m_values == (512,)
    drv.clear()
    op(*operands(512))
    drv.assert_roles(["gemm", "drain", "reduce", "quantize", "gather_barrier", "pull"])
    with pytest.raises(ArtifactMissingError) as ei:
        op(*operands(256))
    assert 'gather_dtype = "fp8"' in ei.value.manifest_lines
    assert 'gather_transport = "lsa"' in ei.value.manifest_lines
    op.close()
    with pytest.raises(ArtifactMissingError, match="no kernels"):  # fp8 at K=512 was never built
        make_op(smoke_store, smoke_lock, k=512, gather_dtype="fp8", gather_transport="sdma")


def test_bf16_wire_ignores_gather_transport(smoke_store, smoke_lock):
    op, _c, drv = make_op(smoke_store, smoke_lock, gather_transport="sdma")
    op(*operands(256))
    assert len(drv.launches) == 4
    op.close()


def test_jit_fallback_warns_every_time_and_names_why_it_cannot(smoke_store, smoke_lock, caplog, monkeypatch):
    monkeypatch.setitem(sys.modules, "mori", None)  # mori is not installed here; make sure of it
    lock = _without_m(smoke_lock, 256)
    op, _c, _d = make_op(None, smoke_lock, artifacts=(lock, smoke_store), jit_fallback=True)
    for _ in range(2):
        with caplog.at_level(logging.WARNING, logger="gemmar_aot.runtime"):
            with pytest.raises(ArtifactMissingError, match="jit_fallback=True, but mori's op cannot be imported"):
                op(*operands(256))
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING and "M=256" in r.getMessage()]
    assert len(warnings) == 2 and "falling back to mori's JIT op" in warnings[0].getMessage()
    op.close()


def test_supports_answers_from_rules_and_artifacts(smoke_store):
    s = smoke_store
    assert supports(256, N, K, WORLD, artifacts=s)
    assert supports(1, N, K, WORLD, artifacts=s)  # pads to 256
    assert supports(400, N, 512, WORLD, artifacts=s)
    assert supports(512, N, K, WORLD, artifacts=s, m_max=512)
    assert not supports(512, N, K, WORLD, artifacts=s, m_max=1024)  # another window
    assert not supports(768, N, K, WORLD, artifacts=s)  # not built
    assert not supports(256, N, 384, WORLD, artifacts=s)  # not built
    assert not supports(256, N, 200, WORLD, artifacts=s)  # rule: K % 128
    assert not supports(256, N, K, WORLD, block_n=512, artifacts=s)  # rule: permlane
    assert not supports(256, N, K, 3, artifacts=s)  # rule: world
    lock = read_lock(s / "locks" / "smoke.lock.json").to_json()
    t, _r = tuple_entry(lock, m=256)
    for r in t["ranks"][1:]:
        drop_rank(lock, lock["tuples"].index(t), r)
    assert not supports(256, N, K, WORLD, artifacts=(lock, s))  # built for rank 0 only
    assert not supports(256, N, K, WORLD, artifacts="/nonexistent/store")
    assert GemmAllReduceOp.supports(256, N, K, WORLD, artifacts=s)


# ---------------------------------------------------------------------------
# self-test, close
# ---------------------------------------------------------------------------


def test_self_test_launch_order_and_failure_message(smoke_store, smoke_lock):
    op, _c, drv = make_op(smoke_store, smoke_lock, rank=1)
    drv.clear()
    with pytest.raises(SelfTestError) as ei:
        op.self_test()
    msg = str(ei.value)
    assert "BUILD_CCO_SDMA" in msg and "MORI_ENABLE_SDMA" in msg and "M=512" in msg and "3 was expected" in msg
    _t, r = tuple_entry(smoke_lock, m=512, rank=1)
    drv.assert_roles(["scatter", "reduce", "gather"])
    assert [l.digest for l in drv.launches] == [e.blob.hash for e in r.self_test]
    assert drv.syncs == [drv.stream]  # synchronised once, after the sequence
    assert bool((op._plans[512].input == 2).all())  # rank 1 wrote rank + 1
    drv.clear()
    with pytest.raises(SelfTestError, match="M=256"):
        op.self_test(256)
    assert "scatter" in drv.launches[0].kinds
    op.close()


def test_self_test_tolerance(smoke_store, smoke_lock):
    op, _c, drv = make_op(smoke_store, smoke_lock)
    out = op._plans[512].output
    # stand in for the all-reduce's result, after the launches: sum(1..world) = 3 everywhere
    drv.synchronize = lambda stream: out.fill_(3.0)
    op.self_test()
    drv.synchronize = lambda stream: out.fill_(2.96)  # bf16 2.953125: 1.6 % off
    with pytest.raises(SelfTestError, match="2.95312 where 3 was expected"):
        op.self_test()
    drv.synchronize = lambda stream: out.fill_(2.98)  # bf16 2.984375: 0.5 % off, within 1e-2
    op.self_test()
    drv.synchronize = lambda stream: out.fill_(0.0)
    with pytest.raises(SelfTestError):
        op.self_test()
    op.close()


def test_close_is_idempotent_and_context_manager(smoke_store, smoke_lock):
    comm, drv = FakeCommunicator(), FakeHipDriver([smoke_lock])
    with GemmAllReduceOp(comm, n=N, k=K, m_max=512, driver=drv, artifacts=smoke_store, self_test=False) as op:
        op(*operands(256))
    assert comm.released == {"window": 1, "mem": 1}
    op.close()
    op.close()
    assert comm.released == {"window": 1, "mem": 1} and drv.counters["unload_module"] == drv.counters["load_module"]
    with pytest.raises(RuntimeError, match="closed"):
        op(*operands(256))
    with pytest.raises(RuntimeError, match="closed"):
        op.self_test()


def test_pad_rows(smoke_store, smoke_lock):
    op, _c, _d = make_op(smoke_store, smoke_lock)
    x = torch.arange(6, dtype=torch.float32).view(3, 2)
    y = op.pad_rows(x, 256)
    assert y.shape == (256, 2) and torch.equal(y[:3], x) and not y[3:].any()
    with pytest.raises(ValueError, match="smaller"):
        op.pad_rows(x, 2)
    op.close()


# ---------------------------------------------------------------------------
# coverage
# ---------------------------------------------------------------------------


def _cli(args):
    from click.testing import CliRunner

    from gemmar_aot.cli import main

    return CliRunner().invoke(main, args)


def test_coverage_all_built(smoke_store):
    res = _cli(["coverage", "--store", str(smoke_store), "--tokens", "1..512", "--world", "2", "--n", "1024",
                "--k", "512"])
    assert res.exit_code == 0, res.output
    assert "every M the server can request is built" in res.output


def test_coverage_lists_missing_and_lines(smoke_store):
    from gemmar_aot.builder.manifest import parse_manifest

    lock = smoke_store / "locks" / "smoke.lock.json"
    res = _cli(["coverage", str(lock), "--min-tokens", "1", "--max-tokens", "512", "--world", "2", "--n", "1024",
                "--k", "256", "--gather-dtype", "fp8", "--json"])
    assert res.exit_code == 1, res.output
    rep = json.loads(res.output)
    assert rep["needed"] == [256, 512] and rep["present"] == [512] and rep["missing"] == [256]
    assert rep["m_max"] == 512 and rep["beyond_window"] == []
    m = parse_manifest('[manifest]\nname = "x"\n\n' + rep["manifest_lines"], "x.toml")
    assert [(w.m, w.m_max, w.gather_dtype) for w in m.workloads] == [(256, 512, "fp8")]


def test_coverage_beyond_the_window_rebuilds_everything(smoke_store):
    from gemmar_aot.runtime.coverage import coverage

    rep = coverage(smoke_store, tokens=(1, 1000), world=2, n=1024, k=256)
    assert rep.needed == [256, 512, 768, 1024] and rep.missing == [768, 1024] and rep.beyond_window == [768, 1024]
    assert "m = { start = 256, stop = 1024, step = 256 }" in rep.manifest_lines
    assert "m_max = 1024" in rep.manifest_lines
    assert "exceed the window" in rep.format()
    res = _cli(["coverage", "--store", str(smoke_store), "--tokens", "1..100000", "--world", "2", "--n", "1024",
                "--k", "256"])
    assert res.exit_code == 1 and "MISSING" in res.output
    res = _cli(["coverage", "--store", str(smoke_store), "--tokens", "1..512", "--world", "2", "--n", "1000",
                "--k", "256"])
    assert res.exit_code == 2 and "N must be a multiple" in res.output


def test_unload_modules_releases_every_module_even_when_one_fails():
    """close() of either op: one failing hipModuleUnload must not leak the other modules."""
    from gemmar_aot.runtime.driver import unload_modules

    class Driver:
        def __init__(self):
            self.unloaded = []

        def unload_module(self, module):
            if module == "bad":
                raise RuntimeError("hipModuleUnload failed for bad")
            self.unloaded.append(module)

    drv, modules, errors = Driver(), ["a", "bad", "c"], []
    unload_modules(drv, modules, errors)
    assert modules == [] and drv.unloaded == ["c", "a"]  # newest first, as they were loaded
    assert [str(e) for e in errors] == ["hipModuleUnload failed for bad"]


def test_construction_runs_without_the_cyclic_gc_and_gives_it_back(smoke_store, smoke_lock):
    """Getting ready pauses the collector (runtime.gc_pause) and restores the state it found,
    on success, on failure, and when the application had disabled it itself."""
    import gc

    class Watching(FakeHipDriver):
        def load_module(self, image):
            seen.append(gc.isenabled())
            return super().load_module(image)

    assert gc.isenabled()
    seen: list[bool] = []
    op, _comm, _drv = make_op(smoke_store, smoke_lock, driver=Watching([smoke_lock]))
    op.close()
    assert seen and not any(seen) and gc.isenabled()

    seen.clear()
    with pytest.raises(ValueError):
        make_op(smoke_store, smoke_lock, quant="int4")  # refused before anything is loaded
    assert gc.isenabled()

    gc.disable()
    try:
        op, _comm, _drv = make_op(smoke_store, smoke_lock, driver=Watching([smoke_lock]))
        op.close()
        assert not gc.isenabled()  # the application's choice stands
    finally:
        gc.enable()


# ---------------------------------------------------------------------------
# the launch sequence is the mode's (lock-only edits, records and index intact)
# ---------------------------------------------------------------------------

def _edit_sequence(doc, edit):
    _t, r = tuple_entry(doc, m=512)
    edit(r["launches"], r["self_test"])


@pytest.mark.parametrize("edit, says", [
    (lambda la, st: la.pop(2), r"launches \['gemm', 'drain', 'gather'\], where fused-sdma"),
    (lambda la, st: la.insert(2, la[1]), r"launches \['gemm', 'drain', 'drain', 'reduce', 'gather'\]"),
    (lambda la, st: la.__setitem__(slice(2, 4), [la[3], la[2]]), r"launches \['gemm', 'drain', 'gather', 'reduce'\]"),
    (lambda la, st: st.pop(), r"self-tests with \['scatter', 'reduce'\], where fused-sdma"),
], ids=["dropped", "duplicated", "reordered", "self-test-dropped"])
def test_a_launch_sequence_that_is_not_the_modes_is_refused(smoke_store, smoke_lock, edit, says):
    """Every digest stays consistent (the entries are the lock's own); only the mode's sequence
    (gemmar_aot.model.launch_sequence) tells. Before it, dropping the third launch gave gemm, drain, gather."""
    doc = _lock(smoke_lock)
    _edit_sequence(doc, edit)
    comm = FakeCommunicator()
    with pytest.raises(ArtifactMismatchError, match=says) as err:
        make_op(None, smoke_lock, comm=comm, artifacts=(doc, smoke_store))
    assert "M=512 rank 0" in str(err.value) and "rebuild the manifest" in str(err.value)
    assert not comm.acquired


def test_another_ranks_kernel_in_a_ranks_slot_is_refused_by_its_symbol(smoke_store, smoke_lock):
    """Rank 1's GEMM (symbol ..._r1) in rank 0's first launch: refused naming both ranks."""
    doc = _lock(smoke_lock)
    _t, r0 = tuple_entry(doc, m=512, rank=0)
    _t, r1 = tuple_entry(doc, m=512, rank=1)
    key1 = r1["launches"][0]
    part(doc, 0)["kernels"][key1] = kernel_entry(doc, key1)
    r0["launches"][0] = key1
    with pytest.raises(ArtifactMismatchError, match=r"its gemm is \S+_r1, rank 1's kernel, in rank 0's slot"):
        make_op(None, smoke_lock, artifacts=(doc, smoke_store))
