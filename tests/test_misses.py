"""Miss reports (gemmar_aot.runtime.misses) and `gemmar-aot suggest` (gemmar_aot.builder.suggest).

A pod's misses become JSON lines; eight processes appending to one report at once lose and
duplicate nothing; `suggest` turns reports into manifest lines, and a manifest with those lines,
built for real, serves every reported M with no miss left.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from fakes import FakeCommunicator, FakeHipDriver
from gemmar_aot.model.lock import read_lock
from gemmar_aot.cli import main
from gemmar_aot.runtime import ArtifactMissingError, GemmAllReduceOp
from gemmar_aot.runtime.misses import ENV_VAR, read_reports

ROOT = Path(__file__).resolve().parents[1]
FP8 = torch.float8_e4m3fn


def _operands(m, n=1024, k=256):
    return (torch.zeros(m, k, dtype=FP8), torch.zeros(n, k, dtype=FP8), torch.ones(k // 128, m),
            torch.ones(n // 128, k // 128))


def test_eight_processes_appending_at_once_lose_and_duplicate_nothing(tmp_path):
    report = tmp_path / "misses.jsonl"
    code = textwrap.dedent(f"""
        import sys, time
        from gemmar_aot.runtime.misses import reporter
        r = reporter({str(report)!r})
        while time.time() < float(sys.argv[2]):  # start together
            pass
        for i in range(200):
            for _ in range(3):  # each distinct miss three times: one line
                r.report(op="GemmAllReduceOp", tuple_id={{"transport": "fused-sdma", "n": 1024, "k": 256,
                         "world": 2, "quant": "blockscale", "gather_dtype": "bf16", "gather_transport": None,
                         "block_m": 128, "sdma_queues": 1, "m_max": 51200}}, m=256 * (i + 1), served=None,
                         error="ArtifactMissingError", rank=int(sys.argv[1]), profile="default",
                         locks=["0" * 64])
    """)
    import time

    start = time.time() + 2.0
    procs = [subprocess.Popen([sys.executable, "-c", code, str(i), str(start)], cwd=ROOT) for i in range(8)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 8
    raw = report.read_bytes()
    assert raw.endswith(b"\n")
    lines, problems = read_reports([report])
    assert problems == [] and len(lines) == 8 * 200
    assert len({(d["pid"], d["m"]) for d in lines}) == 8 * 200  # none lost, none twice
    assert {d["rank"] for d in lines} == set(range(8))


def test_a_miss_at_call_time_is_reported_once_per_process(smoke_store, smoke_lock, tmp_path, monkeypatch):
    """The fp8/lsa smoke tuple is built for M=512 only in a 512 window: M=256 misses."""
    report = tmp_path / "reports"
    report.mkdir()
    monkeypatch.setenv(ENV_VAR, str(report))
    op = GemmAllReduceOp(FakeCommunicator(rank=0, nranks=2), n=1024, k=256, m_max=512, gather_dtype="fp8",
                         gather_transport="lsa", artifacts=smoke_store, driver=FakeHipDriver([smoke_lock]),
                         self_test=False)
    try:
        assert op.m_values == (512,)
        for _ in range(3):
            with pytest.raises(ArtifactMissingError):
                op(*_operands(256))
        op(*_operands(512))  # served: no report
    finally:
        op.close()
    (f,) = report.glob("misses-*.jsonl")
    lines, _ = read_reports([report])
    (d,) = lines
    assert d["m"] == 256 and d["served"] is None and d["error"] == "ArtifactMissingError" and d["rank"] == 0
    assert d["tuple"] == {"transport": "fused-sdma", "n": 1024, "k": 256, "world": 2, "quant": "blockscale",
                          "gather_dtype": "fp8", "gather_transport": "lsa", "block_m": 128, "sdma_queues": 1,
                          "m_max": 512}
    import hashlib

    assert d["locks"] == [hashlib.sha256((smoke_store / "locks" / "smoke.lock.json").read_bytes()).hexdigest()]
    # suggest, against the smoke manifest: the one line that would have served it
    r = CliRunner().invoke(main, ["suggest", str(report), "--manifest", str(ROOT / "manifests" / "smoke.toml"),
                                  "--json"])
    assert r.exit_code == 0, r.output
    s = json.loads(r.stdout)
    assert s["misses"] == 1 and [g["m"] for g in s["groups"]] == [[256]]
    assert 'gather_dtype = "fp8"' in s["snippet"] and "m = 256" in s["snippet"] and "m_max = 512" in s["snippet"]


def test_suggested_lines_built_serve_every_reported_m(tmp_path, tiny_manifest):
    """A tiny manifest (split-lsa, M=256, window 512) in a pod asked for M=512: the report, `suggest
    --write`, a real build of the edited manifest, and the same pod serves M=512 with no miss."""
    text = tiny_manifest.read_text().replace("world = 2", "world = 2\nm_max = 512", 1)
    tiny_manifest.write_text("# the team's comment, kept\n" + text)
    store = tmp_path / "store"
    from gemmar_aot.builder.pipeline import run_build

    s = run_build(tiny_manifest, store=store, jobs=2, progress=False)
    assert s["failed"] == 0
    lock = read_lock(store / "locks" / "tiny.lock.json")
    report = tmp_path / "misses.jsonl"

    def ask(m):
        op = GemmAllReduceOp(FakeCommunicator(rank=0, nranks=2), n=1024, k=256, m_max=512, transport="split-lsa",
                             artifacts=store, driver=FakeHipDriver([read_lock(store / "locks" / "tiny.lock.json")]),
                             self_test=False, miss_report=report)
        try:
            op(*_operands(m))
        finally:
            op.close()

    ask(256)
    with pytest.raises(ArtifactMissingError):
        ask(512)
    r = CliRunner().invoke(main, ["suggest", str(report), "--manifest", str(tiny_manifest), "--write"])
    assert r.exit_code == 0, r.output
    edited = tiny_manifest.read_text()
    assert edited.startswith("# the team's comment, kept\n" + text.rstrip("\n")) and "gemmar-aot suggest" in edited
    s = run_build(tiny_manifest, store=store, jobs=2, progress=False)
    assert s["failed"] == 0 and s["compiled"] >= 1
    assert read_lock(store / "locks" / "tiny.lock.json") != lock
    before = len(read_reports([report])[0])
    ask(512)  # served now
    ask(256)
    assert len(read_reports([report])[0]) == before  # no new miss
    r = CliRunner().invoke(main, ["suggest", str(report), "--manifest", str(tiny_manifest), "--json"])
    assert json.loads(r.stdout)["snippet"] == ""  # everything reported is built


def test_suggest_refuses_to_write_an_invalid_manifest_and_skips_bad_lines(tmp_path):
    from gemmar_aot.util.errors import GemmarError
    from gemmar_aot.builder.suggest import write_into

    man = tmp_path / "m.toml"
    man.write_text('[manifest]\nname = "m"\n\n[[tuple]]\ntransport = "fused-sdma"\nm = 256\nn = 1024\nk = 256\n'
                   'world = 2\n')
    before = man.read_bytes()
    with pytest.raises(GemmarError, match="nothing was written"):
        write_into(man, '[[tuple]]\ntransport = "fused-sdma"\nm = 100\nn = 1024\nk = 256\nworld = 2', ["r"])
    assert man.read_bytes() == before
    bad = tmp_path / "r.jsonl"
    bad.write_text('{"schema": 1, "tuple": {}}\nnot json\n{"schema": 9, "tuple": {}}\n')
    lines, problems = read_reports([bad])
    assert len(lines) == 1 and len(problems) == 2


# ---- bucket planning ----

def _brute(hist, budget, step):
    import itertools

    from gemmar_aot.builder.suggest import padded_work

    cands = sorted({-(-m // step) * step for m in hist})
    top = cands[-1]
    best = None
    for k in range(1, budget + 1):
        for rest in itertools.combinations(cands[:-1], k - 1):
            done, _ = padded_work(hist, [*rest, top])
            best = done if best is None else min(best, done)
    return best


def test_the_planned_buckets_are_the_optimum_of_a_brute_force_on_small_cases():
    import random

    from gemmar_aot.builder.suggest import padded_work, plan_buckets

    rng = random.Random(20261203)
    for _ in range(150):
        step = rng.choice([256, 512, 1024])
        hist = {rng.randint(1, 12 * step): rng.randint(1, 1000) for _ in range(rng.randint(1, 9))}
        budget = rng.randint(1, 5)
        got = plan_buckets(hist, budget, step)
        assert len(got) <= budget and all(b % step == 0 for b in got)
        done, _ = padded_work(hist, got)
        assert done <= _brute(hist, budget, step) * 1.01  # within 1% (it is exact: equal)
        assert done == _brute(hist, budget, step)


def test_suggest_tokens_against_the_manifest_in_use(tmp_path):
    hist = tmp_path / "tokens.csv"
    # a serving log: many short batches, a tail of long ones (synthetic)
    rows = {1000: 500, 1500: 300, 3000: 120, 7000: 40, 15000: 5}
    hist.write_text("tokens,count\n" + "".join(f"{m},{c}\n" for m, c in rows.items()))
    r = CliRunner().invoke(main, ["suggest", "--tokens", str(hist), "--budget", "3", "--world", "8", "--block-m",
                                  "128", "--manifest", str(ROOT / "manifests" / "dsv4-pro-wo_b.toml"), "--json"])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout)
    assert len(d["buckets"]) == 3 and d["buckets"][-1] == 15360 and all(b % 1024 == 0 for b in d["buckets"])
    assert d["rows_asked"] == sum(m * c for m, c in rows.items()) and d["overhead"] > 0
    cur = d["manifest"]
    assert cur["buckets"][0] == 4096 and cur["tokens_above_largest"] == 0 and cur["overhead"] > d["overhead"]
    r = CliRunner().invoke(main, ["suggest", "--tokens", str(hist)])
    assert r.exit_code == 2 and "--budget" in r.output


# ---- op.stats() and the Prometheus metrics ----

def test_stats_count_calls_launches_misses_and_startup(smoke_store, smoke_lock):
    drv = FakeHipDriver([smoke_lock])
    op = GemmAllReduceOp(FakeCommunicator(rank=0, nranks=2), n=1024, k=256, m_max=512, gather_dtype="fp8",
                         gather_transport="lsa", artifacts=smoke_store, driver=drv, self_test=False)
    try:
        drv.clear()
        for _ in range(3):
            op(*_operands(512))
        with pytest.raises(ArtifactMissingError):
            op(*_operands(256))
        s = op.stats()
        assert s["calls"] == {512: 3} and s["misses"] == {256: 1} and s["padded_rows"] == 0
        assert s["launches"] == {512: len(drv.launches)}  # what the HIP double saw launched
        assert s["startup_seconds"] > 0
        pytest.importorskip("prometheus_client")
        from prometheus_client import CollectorRegistry, generate_latest

        from gemmar_aot.runtime.metrics import register

        reg = CollectorRegistry()
        register(op, reg)
        text = generate_latest(reg).decode()
        assert 'gemmar_aot_calls_total{m="512",rank="0",transport="fused-sdma"} 3.0' in text
        assert 'gemmar_aot_misses_total{m="256",rank="0",transport="fused-sdma"} 1.0' in text
        assert f'gemmar_aot_launches_total{{m="512",rank="0",transport="fused-sdma"}} {float(len(drv.launches))}' in text
        assert 'gemmar_aot_call_m_bucket{le="512.0",rank="0",transport="fused-sdma"} 3.0' in text
        assert "gemmar_aot_startup_seconds" in text
    finally:
        op.close()


# ---- torch ----

def test_the_op_inside_torch_compile_fullgraph_on_cpu_with_the_double(smoke_store, smoke_lock, tmp_path,
                                                                     monkeypatch):
    """The custom ops trace without a graph break (fullgraph=True raises on one), and the compiled
    function returns what the op itself returns, its launches the same as a direct call's."""
    from gemmar_aot.runtime.torch_op import as_torch_op

    # torch.compile keeps a cache (default: the temp directory's torchinductor_<user>): the test's own
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "torchinductor"))

    drv = FakeHipDriver([smoke_lock])
    op = GemmAllReduceOp(FakeCommunicator(rank=0, nranks=2), n=1024, k=256, m_max=512, artifacts=smoke_store,
                         driver=drv, self_test=False)
    try:
        f = as_torch_op(op)
        operands = _operands(512)
        drv.clear()
        direct = op(*operands).clone()
        direct_launches = [(x.digest, x.grid, x.block) for x in drv.launches]

        def step(a, b, a_scale, b_scale):
            return f(a, b, a_scale, b_scale) * 1  # something around it in the same graph

        compiled = torch.compile(step, fullgraph=True, backend="aot_eager")
        drv.clear()
        got = compiled(*operands)
        assert torch.equal(got, direct) and got.shape == (512, 1024) and got.dtype == torch.bfloat16
        assert [(x.digest, x.grid, x.block) for x in drv.launches] == direct_launches
        out = torch.empty(512, 1024, dtype=torch.bfloat16)
        compiled_out = torch.compile(lambda *t: f(*t, out=out), fullgraph=True, backend="aot_eager")
        compiled_out(*operands)
        assert torch.equal(out, direct)
    finally:
        op.close()
    with pytest.raises(RuntimeError, match="was closed"):
        f(*_operands(512))


# ---- on_miss="pad" ----

def _fp8_operands(m, n=1024, k=256, seed=0):
    g = torch.Generator().manual_seed(seed)
    a = (torch.rand(m, k, generator=g) * 4 - 2).to(FP8)
    b = (torch.rand(n, k, generator=g) * 4 - 2).to(FP8)
    return a, b, torch.rand(k // 128, m, generator=g) + 0.5, torch.rand(n // 128, k // 128, generator=g) + 0.5


@pytest.mark.parametrize("transport, wire", [("fused-sdma", "fp8/lsa"), ("fused-sdma", "fp8/sdma"),
                                             ("split-sdma", "bf16"), ("split-lsa", "bf16"), ("fused-lsa", "bf16")])
@pytest.mark.parametrize("rank", [0, 1])
def test_pad_launches_the_bucket_exactly_as_a_call_at_the_bucket_with_padded_operands(smoke_store, smoke_lock,
                                                                                      tmp_path, transport, wire, rank):
    """Each of these smoke tuples is built for M=512 only: with on_miss="pad" a call at M=256 runs
    the M=512 kernels with the same grids, blocks and arguments as a call at M=512 whose A and A
    scale are the caller's zero-extended, but for the two pointers, which are the op's own
    buffers, holding exactly those bytes. (A call at the bucket is mori's op at the HIP ABI:
    test_parity.py.)"""
    drv = FakeHipDriver([smoke_lock])
    report = tmp_path / "m.jsonl"
    gd, _, gt = wire.partition("/")
    op = GemmAllReduceOp(FakeCommunicator(rank=rank, nranks=2), n=1024, k=256, m_max=512, gather_dtype=gd,
                         gather_transport=gt or "lsa", transport=transport, artifacts=smoke_store, driver=drv,
                         self_test=False, on_miss="pad", miss_report=report)
    try:
        a, b, a_scale, b_scale = _fp8_operands(256)
        pad_a, pad_s = op._pad.a.data_ptr(), op._pad.scale.data_ptr()
        drv.clear()
        out = op(a, b, a_scale, b_scale)
        padded = list(drv.launches)
        assert out.shape == (256, 1024) and out.data_ptr() == op._plans[512].output.data_ptr()
        a512 = torch.cat([a, torch.zeros(256, 256, dtype=FP8)])
        s512 = torch.cat([a_scale, torch.zeros(2, 256)], dim=1).contiguous()  # (kb, M): kb * M + row
        assert torch.equal(op._pad.a[:512].view(torch.uint8), a512.view(torch.uint8))
        assert torch.equal(op._pad.scale[:2 * 512], s512.reshape(-1))
        drv.clear()
        op(a512, b, s512, b_scale)
        direct = list(drv.launches)
        assert [(x.kernel, x.digest, x.grid, x.block) for x in padded] == [(x.kernel, x.digest, x.grid, x.block)
                                                                         for x in direct]
        for p, d in zip(padded, direct):
            diff = {(pv, dv) for pv, dv in zip(p.args, d.args) if pv != dv}
            assert diff <= {(pad_a, a512.data_ptr()), (pad_s, s512.data_ptr())}, p.kernel
        assert {pv for p, d in zip(padded, direct) for pv, dv in zip(p.args, d.args) if pv != dv} == \
            {pad_a, pad_s}  # the GEMM reads the op's buffers
        # a second padded call reuses the buffers; stats and the report say what happened
        op(*_fp8_operands(256, seed=1))
        assert (op._pad.a.data_ptr(), op._pad.scale.data_ptr()) == (pad_a, pad_s)
        s = op.stats()
        assert s["padded_rows"] == 2 * 256 and s["misses"] == {256: 2} and s["calls"] == {512: 3}
        (line,) = read_reports([report])[0]
        assert line["m"] == 256 and line["served"] == 512 and line["error"] is None and line["rank"] == rank
    finally:
        op.close()


def _preshuffled(exps):
    """mori's ``preshuffle_a_scale`` (amd-mori 1.2.4 ``_shuffle.py``, as its docstring states it),
    written here from that statement: ue8m0 bytes ``[M, K/32]`` to K-block major, each 64-row
    group's row ``ti*16 + r`` moved to ``r*4 + ti``; flat int32."""
    m, kb = exps.shape
    out = exps.t().contiguous().view(kb, m // 64, 4, 16).permute(0, 1, 3, 2).contiguous()
    return out.reshape(-1).view(torch.int32)


@pytest.mark.parametrize("rank", [0, 1])
def test_pad_lays_an_mxfp8_a_scale_out_for_the_bucket(smoke_store, smoke_lock, rank):
    """The smoke mxfp8 tuple built for M=1024 alone serves M=512 padded: its A scale buffer holds
    what mori's preshuffle makes of the caller's scale bytes zero-extended to 1024 rows, and the
    launches are a call at 1024 with those operands, but for the two buffer pointers."""
    drv = FakeHipDriver([smoke_lock])
    op = GemmAllReduceOp(FakeCommunicator(rank=rank, nranks=2), n=2048, k=256, m_max=1024, quant="mxfp8",
                         artifacts=smoke_store, driver=drv, self_test=False, on_miss="pad")
    try:
        assert op.m_values == (1024,)
        g = torch.Generator().manual_seed(rank)
        exps = torch.randint(100, 140, (512, 256 // 32), generator=g, dtype=torch.uint8)
        a = (torch.rand(512, 256, generator=g) * 4 - 2).to(FP8)
        b = (torch.rand(2048, 256, generator=g) * 4 - 2).to(FP8)
        b_scale = torch.randint(100, 140, ((2048 // 32) * (256 // 32),), generator=g, dtype=torch.int32)
        drv.clear()
        out = op(a, b, _preshuffled(exps), b_scale)
        padded = list(drv.launches)
        assert out.shape == (512, 2048)
        a1024 = torch.cat([a, torch.zeros(512, 256, dtype=FP8)])
        s1024 = _preshuffled(torch.cat([exps, torch.zeros(512, 256 // 32, dtype=torch.uint8)]))
        assert torch.equal(op._pad.a[:1024].view(torch.uint8), a1024.view(torch.uint8))
        assert torch.equal(op._pad.scale[:s1024.numel()], s1024)
        drv.clear()
        op(a1024, b, s1024, b_scale)
        direct = list(drv.launches)
        assert [(x.kernel, x.digest, x.grid, x.block) for x in padded] == [(x.kernel, x.digest, x.grid, x.block)
                                                                         for x in direct]
        pads = (op._pad.a.data_ptr(), op._pad.scale.data_ptr())
        assert {(pv, dv) for p, d in zip(padded, direct) for pv, dv in zip(p.args, d.args) if pv != dv} == \
            {(pads[0], a1024.data_ptr()), (pads[1], s1024.data_ptr())}
        assert op.stats()["padded_rows"] == 512
    finally:
        op.close()


def test_pad_above_the_largest_bucket_raises_and_raise_is_unchanged(smoke_store, smoke_lock, monkeypatch):
    def make(**kw):
        return GemmAllReduceOp(FakeCommunicator(rank=0, nranks=2), n=1024, k=256, m_max=512, artifacts=smoke_store,
                               driver=FakeHipDriver([smoke_lock]), self_test=False, **kw)

    monkeypatch.setenv("GEMMAR_AOT_ON_MISS", "pad")
    op = make(gather_dtype="fp8", gather_transport="lsa")
    try:
        assert op._on_miss == "pad"
        with pytest.raises(ValueError, match="exceeds the window's m_max"):
            op(*_operands(768))
    finally:
        op.close()
    monkeypatch.delenv("GEMMAR_AOT_ON_MISS")
    op = make(gather_dtype="fp8", gather_transport="lsa")
    try:
        assert op._on_miss == "raise" and op._pad is None
        with pytest.raises(ArtifactMissingError):
            op(*_operands(256))
    finally:
        op.close()
    with pytest.raises(ValueError, match="use 'raise' or 'pad'"):
        make(on_miss="round")


def test_gemm_only_is_never_padded(smoke_store, smoke_lock):
    """gemm_only() at an unbuilt M raises even with on_miss="pad": the bucket's GEMM alone is not a
    GEMM at M, and running the whole call instead would launch the all-reduce unasked."""
    drv = FakeHipDriver([smoke_lock])
    op = GemmAllReduceOp(FakeCommunicator(rank=0, nranks=2), n=1024, k=256, m_max=512, transport="split-lsa",
                         artifacts=smoke_store, driver=drv, self_test=False, on_miss="pad")
    try:
        drv.clear()
        with pytest.raises(ArtifactMissingError):
            op.gemm_only(*_operands(256))
        assert drv.launches == []
        op.gemm_only(*_operands(512))
        assert len(drv.launches) == 1
    finally:
        op.close()


# ---- the collective-free ops ----

def test_the_collective_free_ops_report_their_misses_and_suggest_builds_them(smoke_store, smoke_lock, tmp_path,
                                                                             monkeypatch):
    """Mxfp8GemmOp (a tile not built) and Mxfp8GemvOp (a bucket not built) count and report each
    miss as the collective op does; suggest turns the report into lines that, parsed, ask for the
    missing tile's M and the missing bucket."""
    from lock_docs import keep_tuples

    from gemmar_aot.builder.manifest import parse_manifest
    from gemmar_aot.runtime import Mxfp8GemmOp, Mxfp8GemvOp
    from gemmar_aot.builder.suggest import suggest

    report = tmp_path / "misses.jsonl"
    lock = smoke_lock.to_json()
    keep_tuples(lock, lambda t: not (t["transport"] == "gemm-only" and t["m"] == 9216))
    drv = FakeHipDriver([smoke_lock])
    gemm = Mxfp8GemmOp(n=1024, k=256, artifacts=(lock, smoke_store), driver=drv, device="cpu", miss_report=report)
    gemv = Mxfp8GemvOp(n=1024, k=256, artifacts=smoke_store, driver=drv, device="cpu", miss_report=report)
    a = torch.zeros(9216, 256, dtype=FP8)
    for _ in range(2):
        with pytest.raises(ArtifactMissingError, match="wide"):
            gemm(a, torch.zeros(1024, 256, dtype=FP8), torch.zeros(9216 * 256 // 128, dtype=torch.int32),
                 torch.zeros(32 * 8, dtype=torch.int32))
        with pytest.raises(ArtifactMissingError, match=r"bucket 4"):
            gemv(torch.zeros(3, 256, dtype=FP8), torch.zeros(1024, 256, dtype=FP8),
                 torch.zeros(3, 8, dtype=torch.uint8), torch.zeros(32, 8, dtype=torch.uint8))
    assert gemm.stats()["misses"] == {9216: 2} and gemv.stats()["misses"] == {4: 2}
    lines, bad = read_reports([report])
    assert bad == [] and sorted((d["op"], d["m"], d["tuple"]["transport"]) for d in lines) == [
        ("Mxfp8GemmOp", 9216, "gemm-only"), ("Mxfp8GemvOp", 4, "gemv")]  # once per process each
    got = suggest(lines)
    built = parse_manifest(got["snippet"], "suggested.toml").workloads
    assert sorted((w.transport, w.m, w.n, w.k, w.quant) for w in built) == [
        ("gemm-only", 9216, 1024, 256, "mxfp8"), ("gemv", 4, 1024, 256, "mxfp8")]
    gemm.close()
    gemv.close()


@pytest.mark.parametrize("cls, why", [("Mxfp8GemmOp", "tile"), ("Mxfp8GemvOp", "tuned configuration")])
def test_the_collective_free_ops_refuse_pad_and_a_pod_wide_pad_leaves_them_strict(smoke_store, smoke_lock,
                                                                                 monkeypatch, cls, why):
    import gemmar_aot.runtime as rt

    make = lambda **kw: getattr(rt, cls)(n=1024, k=256, artifacts=smoke_store,  # noqa: E731
                                          driver=FakeHipDriver([smoke_lock]), device="cpu", **kw)
    with pytest.raises(ValueError, match=f"on_miss='pad': .*{why}"):
        make(on_miss="pad")
    with pytest.raises(ValueError, match="use 'raise' or 'pad'"):
        make(on_miss="round")
    monkeypatch.setenv("GEMMAR_AOT_ON_MISS", "pad")  # set for the pod: the collective op pads, these raise
    op = make()
    assert op._on_miss == "raise"
    op.close()
