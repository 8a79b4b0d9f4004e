"""Every mode the runtime serves, against the real smoke artifacts and the two test doubles.

GemmAllReduceOp with ``transport=`` split-sdma, split-lsa and fused-lsa (and fused-sdma's
other windows: the fp8/sdma wire, the fused mxfp8 GEMM, world 4), Mxfp8GemmOp and
Mxfp8GemvOp. ``FakeHipDriver`` parses each code object and checks every launch against
the lock's launch record for that blob; ``FakeCommunicator`` backs the window with host
memory. Nothing executes, so these prove what is launched (kernel, grid, block, every
argument), not what it computes.
"""

from __future__ import annotations

import math

import pytest
import torch

from fakes import FakeCommunicator, FakeHipDriver
from lock_docs import keep_tuples
from gemmar_aot.model import rules
from gemmar_aot.builder.manifest import parse_manifest
from gemmar_aot.runtime import ArtifactMissingError, GemmAllReduceOp, Mxfp8GemmOp, Mxfp8GemvOp, supports
from gemmar_aot.runtime.operands import MXFP8_BLOCK

N, K = 1024, 256
FP8 = torch.float8_e4m3fn


def blockscale_operands(m, k=K):
    kb = k // 128
    return (torch.zeros(m, k, dtype=FP8), torch.zeros(N, k, dtype=FP8), torch.ones(kb, m),
            torch.ones(N // 128, kb))


def mxfp8_operands(m, k=K):
    return (torch.zeros(m, k, dtype=FP8), torch.zeros(N, k, dtype=FP8),
            torch.zeros(m * k // 128, dtype=torch.int32), torch.zeros((N // 32) * (k // 32), dtype=torch.int32))


def make_ar(store, lock, *, transport="fused-sdma", rank=0, world=2, **kw):
    comm = FakeCommunicator(rank=rank, nranks=world)
    drv = FakeHipDriver([lock])
    kw.setdefault("m_max", 512)
    op = GemmAllReduceOp(comm, n=N, k=K, transport=transport, artifacts=store, driver=drv, self_test=False, **kw)
    return op, comm, drv


def lock_entries(lock, *, transport, m, rank, **fields):
    """The lock's (LockTuple, RankLaunches) for one tuple and rank: the sequence to expect."""
    for t in lock.tuples:
        if t.id.transport == transport and t.id.m == m and all(getattr(t.id, f) == v for f, v in fields.items()):
            return t, next(r for r in t.ranks if r.rank == rank)
    raise KeyError((transport, m, fields))


def _digest(e):
    return e.blob.hash


# ---------------------------------------------------------------------------
# GemmAllReduceOp(transport=...)
# ---------------------------------------------------------------------------

CALLS = {
    "split-sdma": ["gemm", "scatter", "reduce", "gather"],
    "split-lsa": ["gemm", "lsa_ar"],
    "fused-lsa": ["gemm", "drain", "reduce", "gather"],
}
SELF_TESTS = {
    "split-sdma": ["scatter", "reduce", "gather"],
    "split-lsa": ["lsa_ar"],
    "fused-lsa": ["scatter", "reduce", "gather"],
}


@pytest.mark.parametrize("transport", sorted(CALLS))
@pytest.mark.parametrize("rank", [0, 1])
def test_collective_modes_launch_their_recorded_sequence(smoke_store, smoke_lock, transport, rank):
    op, _comm, drv = make_ar(smoke_store, smoke_lock, transport=transport, rank=rank)
    assert op.m_values == (512,) and op.transport == transport
    t, r = lock_entries(smoke_lock, transport=transport, m=512, rank=rank)
    a, b, a_scale, b_scale = blockscale_operands(512)
    for _ in range(2):
        drv.clear()
        out = op(a, b, a_scale, b_scale)
        assert [l.digest for l in drv.launches] == [_digest(e) for e in r.launches]
        assert [e.kind for e in r.launches] == CALLS[transport]
        gemm = drv.launches[0]
        assert gemm.grid == ((512 // 128) * (N // 256), 1, 1) and gemm.block == (512, 1, 1)
        lay = op._entries[512].layout
        kb = K // 128
        assert gemm.args == (a.data_ptr(), 512 * K, b.data_ptr(), N * K, op.mem.ptr + lay.input_off, 512 * N,
                             a_scale.data_ptr(), 512 * kb, b_scale.data_ptr(), (N // 128) * kb, 512, N,
                             op.dev_comm.ptr, op.win.handle)
        for phase in drv.launches[1:]:
            assert phase.args == (op.dev_comm.ptr, op.win.handle)
        assert out.data_ptr() == op.mem.ptr + lay.output_off and tuple(out.shape) == (512, N)
    # every GEMM is this rank's: the unfused one too (mori's benchmark builds it per rank; the rank is in its name)
    assert gemm.kernel.endswith(f"_r{rank}")
    drv.clear()
    with pytest.raises(Exception, match="self-test failed"):  # nothing executes: the check must fail
        op.self_test()
    drv.assert_roles(SELF_TESTS[transport])
    assert [l.digest for l in drv.launches] == [_digest(e) for e in r.self_test]
    op.close()


def test_split_sdma_shares_fused_sdma_phases_and_split_lsa_gemm(smoke_store, smoke_lock):
    _, fused = lock_entries(smoke_lock, transport="fused-sdma", m=512, rank=1, k=K, gather_dtype="bf16", quant="blockscale",
                            world=2)
    _, split = lock_entries(smoke_lock, transport="split-sdma", m=512, rank=1)
    _, lsa = lock_entries(smoke_lock, transport="split-lsa", m=512, rank=1)
    assert [_digest(e) for e in split.launches[1:]] == [_digest(e) for e in fused.self_test]
    assert _digest(split.launches[0]) == _digest(lsa.launches[0])


def test_gemm_only_runs_the_split_gemm_alone(smoke_store, smoke_lock):
    op, _c, drv = make_ar(smoke_store, smoke_lock, transport="split-lsa")
    _t, r = lock_entries(smoke_lock, transport="split-lsa", m=512, rank=0)
    a, b, a_scale, b_scale = blockscale_operands(512)
    got = op.gemm_only(a, b, a_scale, b_scale)
    assert [l.digest for l in drv.launches] == [_digest(r.launches[0])]
    assert got.data_ptr() == drv.launches[0].args[4] == op.mem.ptr + op._entries[512].layout.input_off
    with pytest.raises(ArtifactMissingError):
        op.gemm_only(*blockscale_operands(256))
    op.close()
    fused, _c, _d = make_ar(smoke_store, smoke_lock, transport="fused-lsa")
    with pytest.raises(ValueError, match="cannot run without its tail"):
        fused.gemm_only(a, b, a_scale, b_scale)
    fused.close()


def test_strict_miss_names_the_transport(smoke_store, smoke_lock):
    op, _c, _d = make_ar(smoke_store, smoke_lock, transport="fused-lsa")
    with pytest.raises(ArtifactMissingError) as ei:
        op(*blockscale_operands(256))
    assert 'transport = "fused-lsa"' in ei.value.manifest_lines
    parse_manifest(ei.value.manifest_lines, "fix.toml")  # the suggested lines are a valid manifest
    op.close()


@pytest.mark.parametrize("kw, match", [
    (dict(transport="gemm-only"), "must be one of fused-sdma, split-sdma, split-lsa, fused-lsa"),
    (dict(transport="split-lsa", gather_dtype="fp8"), "split-lsa all-reduce has no fp8 path"),
    (dict(transport="split-lsa", gather_dtype="fp8", gather_transport="sdma"), "no fp8 path"),
    (dict(transport="split-lsa", sdma_queues=2), "split-lsa uses no SDMA queue"),
    (dict(transport="fused-lsa", gather_dtype="fp8"), "fused-lsa runs the bf16 gather only"),
    (dict(transport="split-sdma", jit_fallback=True), "has no mori class to fall back to"),
])
def test_transport_rules_refuse_before_acquiring(smoke_store, smoke_lock, kw, match):
    comm = FakeCommunicator()
    with pytest.raises(ValueError, match=match):
        GemmAllReduceOp(comm, n=N, k=K, m_max=512, artifacts=smoke_store, driver=FakeHipDriver([smoke_lock]), **kw)
    assert not comm.acquired


def test_supports_per_transport(smoke_store):
    for transport in ("fused-sdma", "split-sdma", "split-lsa", "fused-lsa"):
        assert supports(512, N, K, 2, transport=transport, artifacts=smoke_store)
    assert not supports(256, N, K, 2, transport="fused-lsa", artifacts=smoke_store)  # not built
    assert not supports(512, N, K, 2, transport="split-lsa", gather_dtype="fp8", artifacts=smoke_store)
    assert not supports(512, N, K, 2, transport="gemv", artifacts=smoke_store)


def test_fp8_wire_with_the_sdma_gather(smoke_store, smoke_lock):
    op, _c, drv = make_ar(smoke_store, smoke_lock, gather_dtype="fp8", gather_transport="sdma")
    op(*blockscale_operands(512))
    drv.assert_roles(["gemm", "drain", "reduce", "quantize", "gather", "dequantize"])
    op.close()


def test_fused_mxfp8_gemm_block_m_256(smoke_store, smoke_lock):
    op, _c, drv = make_ar(smoke_store, smoke_lock, quant="mxfp8")
    assert op.block_m == 256 and op.m_values == (512,)
    op(*mxfp8_operands(512))
    gemm = drv.launches[0]
    assert gemm.grid == ((512 // 256) * (N // 256), 1, 1)
    drv.assert_roles(["gemm", "drain", "reduce", "gather"])
    op.close()


@pytest.mark.parametrize("rank", [0, 3])
def test_world_four(smoke_store, smoke_lock, rank):
    op, _c, drv = make_ar(smoke_store, smoke_lock, rank=rank, world=4)
    assert op.m_values == (512,)
    op(*blockscale_operands(512))
    t, r = lock_entries(smoke_lock, transport="fused-sdma", m=512, rank=rank, world=4)
    assert [l.digest for l in drv.launches] == [_digest(e) for e in r.launches]
    assert drv.launches[0].kernel.endswith(f"_r{rank}")
    op.close()


# ---------------------------------------------------------------------------
# Mxfp8GemmOp
# ---------------------------------------------------------------------------


def make_gemm(store, lock, **kw):
    drv = FakeHipDriver([lock])
    return Mxfp8GemmOp(n=N, k=K, artifacts=store, driver=drv, device="cpu", **kw), drv


@pytest.mark.parametrize("m", [64, 256, 1024, 9216, 16384])
def test_gemm_only_serves_every_m_of_its_tiles(smoke_store, smoke_lock, m):
    op, drv = make_gemm(smoke_store, smoke_lock)
    assert op.tiles == ("narrow", "wide")
    a, b, a_scale, b_scale = mxfp8_operands(m)
    out = op(a, b, a_scale, b_scale)
    assert tuple(out.shape) == (m, N) and out.dtype == torch.bfloat16
    (launch,) = drv.launches
    narrow = rules.gemm_only_wants_narrow(m, N)
    bn = 128 if narrow else 256
    assert launch.grid == (math.ceil(m / 256) * (N // bn), 1, 1) and launch.block == (512, 1, 1)
    assert launch.args == (a.data_ptr(), m * K, b.data_ptr(), N * K, out.data_ptr(), m * N, a_scale.data_ptr(),
                           m * K // 128, b_scale.data_ptr(), (N // MXFP8_BLOCK) * (K // MXFP8_BLOCK), m, N, 0, 0)
    op.close()


def test_gemm_only_out_and_no_per_call_buffers(smoke_store, smoke_lock):
    op, drv = make_gemm(smoke_store, smoke_lock)
    buffers = {k: (v.args, v.args.address) for k, v in op._launches.items()}
    out = torch.empty(256, N, dtype=torch.bfloat16)
    for m in (256, 128, 256, 64, 128):  # the grid follows M on every call, cached or not
        drv.clear()
        got = op(*mxfp8_operands(m), out=out[:m])
        assert got.data_ptr() == out.data_ptr()
        assert drv.launches[0].grid == (math.ceil(m / 256) * (N // 128), 1, 1)
        assert drv.launches[0].args[10] == m
    assert {k: (v.args, v.args.address) for k, v in op._launches.items()} == buffers
    with pytest.raises(ValueError, match=r"out must be \(256, 1024\) bfloat16"):
        op(*mxfp8_operands(256), out=torch.empty(256, N))
    op.close()


def test_gemm_only_validation_in_mori_order(smoke_store, smoke_lock):
    with pytest.raises(ValueError, match="unsupported tile: block_n must be exactly 256"):
        make_gemm(smoke_store, smoke_lock, block_n=512)
    with pytest.raises(ValueError, match="unsupported shape: K must be a multiple of 128"):
        Mxfp8GemmOp(n=N, k=200, artifacts=smoke_store, driver=FakeHipDriver([smoke_lock]), device="cpu")
    op, _ = make_gemm(smoke_store, smoke_lock)
    with pytest.raises(ValueError, match="M=100 must be a multiple of 64"):
        op(*mxfp8_operands(100))
    a, b, a_scale, b_scale = mxfp8_operands(256)
    with pytest.raises(ValueError, match="float8_e4m3fnuz"):
        op(a.view(torch.uint8).view(torch.float8_e4m3fnuz), b, a_scale, b_scale)
    with pytest.raises(ValueError, match="a_scale must be"):
        op(a, b, a_scale.view(256, -1), b_scale)
    op.close()
    with pytest.raises(RuntimeError, match="closed"):
        op(a, b, a_scale, b_scale)


def test_gemm_only_missing_tile_is_a_strict_miss(smoke_store, smoke_lock):
    lock = smoke_lock.to_json()  # editable JSON data; artifacts= validates it like a file
    keep_tuples(lock, lambda t: not (t["transport"] == "gemm-only" and t["m"] == 9216))
    drv = FakeHipDriver([smoke_lock])
    op = Mxfp8GemmOp(n=N, k=K, artifacts=(lock, smoke_store), driver=drv, device="cpu")
    assert op.tiles == ("narrow",)
    op(*mxfp8_operands(256))
    with pytest.raises(ArtifactMissingError, match="runs the wide .* tile") as ei:
        op(*mxfp8_operands(9216))
    assert 'transport = "gemm-only"' in ei.value.manifest_lines
    assert parse_manifest(ei.value.manifest_lines, "fix.toml").workloads[0].m == 9216
    with pytest.raises(ArtifactMissingError, match="no Mxfp8GemmOp kernels for N=2048"):
        Mxfp8GemmOp(n=2048, k=K, artifacts=smoke_store, driver=drv, device="cpu")


# ---------------------------------------------------------------------------
# Mxfp8GemvOp
# ---------------------------------------------------------------------------


def gemv_operands(m, k=K):
    kb = k // 32
    return (torch.zeros(m, k, dtype=FP8), torch.zeros(N, k, dtype=FP8), torch.zeros(m, kb, dtype=torch.uint8),
            torch.zeros(N // 32, kb, dtype=torch.uint8))


def make_gemv(store, lock):
    drv = FakeHipDriver([lock])
    return Mxfp8GemvOp(n=N, k=K, artifacts=store, driver=drv, device="cpu"), drv


@pytest.mark.parametrize("m, bucket", [(1, 1), (17, 32), (32, 32)])
def test_gemv_launches_its_bucket_with_m_at_run_time(smoke_store, smoke_lock, m, bucket):
    op, drv = make_gemv(smoke_store, smoke_lock)
    assert op.buckets == (1, 32)
    x, w, xs, ws = gemv_operands(m)
    out = op(x, w, xs, ws)
    assert tuple(out.shape) == (m, N)
    (launch,) = drv.launches
    (t,) = [t for t in smoke_lock.tuples if t.id.transport == "gemv" and t.id.m == bucket]
    assert launch.digest == _digest(t.ranks[0].launches[0])
    kb = K // 32
    assert launch.args == (w.data_ptr(), N * K // 4, ws.data_ptr(), (N // 32) * kb // 4, x.data_ptr(), m * K // 4,
                           xs.data_ptr(), m * kb // 4, out.data_ptr(), m * N, m, N)
    op.close()


def test_gemv_rules_and_misses(smoke_store, smoke_lock):
    with pytest.raises(ValueError, match="unsupported shape N=1040 K=256"):
        Mxfp8GemvOp(n=1040, k=K, artifacts=smoke_store, driver=FakeHipDriver([smoke_lock]), device="cpu")
    op, _drv = make_gemv(smoke_store, smoke_lock)
    with pytest.raises(ValueError, match="M=33 exceeds the skinny kernel's 32 tokens; use Mxfp8GemmOp"):
        op(*gemv_operands(33))
    x, w, xs, ws = gemv_operands(4)
    with pytest.raises(ValueError, match="x_scale must be torch.uint8"):
        op(x, w, xs.to(torch.int32), ws)
    with pytest.raises(ValueError, match=r"w_scale must be \(32, 8\)"):
        op(x, w, xs, ws.view(-1))
    with pytest.raises(ArtifactMissingError, match=r"M=4 \(bucket 4\)") as ei:
        op(x, w, xs, ws)
    assert ei.value.available == (1, 32)
    assert [w_.m for w_ in parse_manifest(ei.value.manifest_lines, "fix.toml").workloads] == [4]
    op.close()


def test_import_rule_holds_for_every_class(smoke_store):
    import textwrap

    from test_runtime import _forbidden, _fresh_modules

    code = textwrap.dedent(f"""
        import torch
        from fakes import FakeCommunicator, FakeHipDriver
        from gemmar_aot.runtime import GemmAllReduceOp, Mxfp8GemmOp, Mxfp8GemvOp
        from gemmar_aot.model.lock import read_lock
        lock = read_lock({str(smoke_store / 'locks' / 'smoke.lock.json')!r}).check_parts()
        fp8 = torch.float8_e4m3fn
        for transport in ("split-sdma", "split-lsa", "fused-lsa"):
            op = GemmAllReduceOp(FakeCommunicator(), n=1024, k=256, m_max=512, artifacts={str(smoke_store)!r},
                                 driver=FakeHipDriver([lock]), self_test=False, transport=transport)
            op(torch.zeros(512, 256, dtype=fp8), torch.zeros(1024, 256, dtype=fp8), torch.ones(2, 512),
               torch.ones(16))
            op.close()
        g = Mxfp8GemmOp(n=1024, k=256, artifacts={str(smoke_store)!r}, driver=FakeHipDriver([lock]), device="cpu")
        g(torch.zeros(256, 256, dtype=fp8), torch.zeros(1024, 256, dtype=fp8), torch.zeros(512, dtype=torch.int32),
          torch.zeros(256, dtype=torch.int32))
        v = Mxfp8GemvOp(n=1024, k=256, artifacts={str(smoke_store)!r}, driver=FakeHipDriver([lock]), device="cpu")
        v(torch.zeros(1, 256, dtype=fp8), torch.zeros(1024, 256, dtype=fp8), torch.zeros(1, 8, dtype=torch.uint8),
          torch.zeros(32, 8, dtype=torch.uint8))
    """)
    mods = _fresh_modules(code)
    assert _forbidden(mods) == []
    assert not any(m == "mori" or m.startswith("mori.") for m in mods)


def test_coverage_per_transport(smoke_store):
    from click.testing import CliRunner

    from gemmar_aot.cli import main

    res = CliRunner().invoke(main, ["coverage", "--store", str(smoke_store), "--tokens", "1..512", "--world", "2",
                                    "--n", "1024", "--k", "256", "--transport", "fused-lsa", "--json"])
    assert res.exit_code == 1, res.output
    import json

    rep = json.loads(res.stdout)
    assert rep["tuple"]["transport"] == "fused-lsa" and rep["present"] == [512] and rep["missing"] == [256]
    fix = parse_manifest('[manifest]\nname = "x"\n\n' + rep["manifest_lines"], "x.toml")
    assert [(w.transport, w.m, w.m_max) for w in fix.workloads] == [("fused-lsa", 256, 512)]
    res = CliRunner().invoke(main, ["coverage", "--store", str(smoke_store), "--tokens", "1..512", "--world", "2",
                                    "--n", "1024", "--k", "256", "--transport", "split-lsa", "--gather-dtype", "fp8"])
    assert res.exit_code == 2 and "no fp8 path" in res.output
