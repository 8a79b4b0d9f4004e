"""Launch parity at the HIP ABI: mori's own op (the oracle) against our runtime (the candidate).

The oracle is mori 1.2.4's ``GemmAllReduceOp`` (and ``Mxfp8GemmOp``) from the
toolchain's sources, run by FlyDSL in its normal mode in a process of its own:
FlyDSL traces and compiles every kernel, loads it through its own runtime library
and launches it with ``kernelParams``. The candidate is
``gemmar_aot.runtime.GemmAllReduceOp`` loading what ``gemmar-aot build`` compiled,
through the real ctypes ``HipDriver`` (``extra``). Both run against the same HIP
test double (tests/hipstub: it records each launch's code object sha256, symbol,
grid, block, LDS, stream and argument bytes, decoding them with the code object's
own metadata note) and the same communicator double. The shims the oracle needs
are listed, with why, in tests/parity/shims.py; exactly one changes mori's
behaviour (its counter slots), and :func:`test_negative_control_first_seen_slots`
shows what that change does.

The shapes are small (N 1024, K 256) so the tier compiles in a few minutes on 2
cores: one oracle process and the candidate build run side by side, once per
session. ``bench/bench_parity.py`` runs the same comparison on the reference
manifest's shapes. Set GEMMAR_AOT_TEST_PARITY_DIR to keep the candidate store and
the oracle's record between sessions (reused only for identical inputs).

What the double cannot prove: it executes nothing. Equal launches mean mori and
we hand HIP the same kernels with the same arguments; whether those kernels
compute the right thing is the GPU tier's job (tests/test_gpu.py).
"""

from __future__ import annotations

import os
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from parity import candidate, compare, shims, tamper
from parity.runner import start_oracle
from parity.scenario import (Scenario, benchmark_mode_scenarios, fused_scenarios, gemm_only_scenario,
                             gemv_scenario, manifest_toml, negative_control)

pytestmark = [pytest.mark.parity, pytest.mark.compile]

FUSED = fused_scenarios()
#: Ops without a window, each covered once the runtime has a class for it (parity.candidate.RUNTIME_CLASSES).
STANDALONE = [gemm_only_scenario(), gemv_scenario()]
#: The modes mori has no op class for: its builders in its benchmark's order are the oracle.
BENCH_MODES = benchmark_mode_scenarios()


def _served(sc: Scenario) -> bool:
    return candidate.runtime_class(sc.transport) is not None


@dataclass
class ParityRun:
    oracle: dict  # scenario name -> the oracle's record
    store: Path
    lock: Path
    stub: object
    stub_path: str
    stream: shims.StreamDouble
    build: dict  # run_build's summary


@pytest.fixture(scope="session")
def parity(hipstub_lib, hip_stub, tmp_path_factory) -> ParityRun:
    """One oracle process for every scenario, side by side with one candidate build; once per session."""
    from gemmar_aot.builder.pipeline import run_build

    scenarios = [*FUSED, negative_control(), *(sc for sc in STANDALONE if _served(sc)), *BENCH_MODES]
    keep = os.environ.get("GEMMAR_AOT_TEST_PARITY_DIR")
    work = Path(keep) if keep else tmp_path_factory.mktemp("parity")
    work.mkdir(parents=True, exist_ok=True)
    (work / "parity.toml").write_text(manifest_toml([s for s in scenarios if s.slots == "rule"]))
    job = start_oracle(scenarios, hipstub_lib, work, reuse=bool(keep))
    try:
        build = run_build(work / "parity.toml", store=work / "store", jobs=2, progress=False)
        oracle = job.wait()
    finally:
        job.kill()
    assert not build["failures"], build["failures"]
    return ParityRun(oracle=oracle, store=work / "store", lock=Path(build["lock_file"]), stub=hip_stub,
                     stub_path=str(hipstub_lib), stream=shims.StreamDouble(hip_stub), build=build)


@pytest.fixture()
def run_candidate(parity, monkeypatch):
    """Run a scenario on our runtime (the stream shim installed for the test's duration)."""
    shims.install_stream_shim(parity.stub, monkeypatch, stream=parity.stream)
    opened = []

    def run(sc: Scenario, artifacts=None, **kw) -> dict:
        res = candidate.run(sc, artifacts=parity.lock if artifacts is None else artifacts, stub=parity.stub,
                            stub_path=parity.stub_path, stream=parity.stream, **kw)
        if res.get("op") is not None:
            opened.append(res["op"])
        return res

    yield run
    for op in opened:
        op.close()


def _check_identical(oracle: dict, cand: dict) -> None:
    o, c = compare.canonical_sequence(oracle), compare.canonical_sequence(cand)
    assert compare.differences(o, c) == [], compare.explain(o, c)


# ---------------------------------------------------------------------------
# the oracle really is mori through FlyDSL's own launch path
# ---------------------------------------------------------------------------


def test_oracle_is_mori_through_flydsls_launch_path(parity):
    for name, res in parity.oracle.items():
        assert res["launches"], name
        # FlyDSL's runtime hands HIP kernelParams (our HipDriver uses extra)
        assert not any(lch["via_extra"] for lch in res["launches"]), name
        assert {lch["stream"] for lch in res["launches"]} == {res["address_map"]["handles"]["stream"]}, name
        # nothing executes on the double: mori's self-test sees no all-reduce
        for verdict in res["self_test"]:
            if res["scenario"]["transport"] == "split-lsa":  # mori has none: the benchmark's all-reduce launch
                assert verdict.startswith("not mori's: the benchmark's lsa_ar launch"), verdict
            else:
                assert verdict.startswith("failed: gemm_ar self-test failed: the all-reduce returned 0"), verdict
        assert len(res["self_test"]) == sum(1 for kind, _ in res["scenario"]["steps"] if kind == "self_test"), name


# ---------------------------------------------------------------------------
# parity
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("sc", FUSED, ids=[s.name for s in FUSED])
def test_launch_parity(parity, run_candidate, sc):
    """Same kernels (sha256), symbols, grids, blocks, LDS, streams and argument bytes, launch by launch."""
    oracle = parity.oracle[sc.name]
    cand = run_candidate(sc)
    assert all(lch["via_extra"] for lch in cand["launches"])
    _check_identical(oracle, cand)
    # the sequence has the shape the mode prescribes: self-tests and every call's GEMM + tail
    kinds = [lch["kernel"] for lch in cand["launches"]]
    assert sum(k.startswith("mori_fused") for k in kinds) == sum(1 for kind, _ in sc.steps if kind == "call")
    assert len(cand["self_test"]) == sum(1 for kind, _ in sc.steps if kind == "self_test")


@pytest.mark.parametrize("sc", STANDALONE, ids=[s.name for s in STANDALONE])
def test_launch_parity_without_a_window(parity, run_candidate, sc):
    """mori's Mxfp8GemmOp / Mxfp8GemvOp against ours: M picks the tile or bucket, the output is the caller's."""
    if not _served(sc):
        pytest.skip(f"the runtime has no class for {sc.transport} (parity.candidate.RUNTIME_CLASSES is the hook: "
                    f"the tier covers it, oracle and build included, once gemmar_aot.runtime exports one)")
    cand = run_candidate(sc)
    _check_identical(parity.oracle[sc.name], cand)
    assert len(cand["launches"]) == len(sc.steps)


#: Launches per call in each mode, as mori's benchmark runs it (oracle.BENCHMARK), and per
#: self-test (mori's op's scatter -> reduce -> gather; for split-lsa the all-reduce alone).
BENCH_LAUNCHES_PER_CALL = {"split-sdma": 4, "split-lsa": 2, "fused-lsa": 4}
BENCH_LAUNCHES_PER_SELF_TEST = {"split-sdma": 3, "split-lsa": 1, "fused-lsa": 3}


#: Divergences between mori's benchmark and our runtime that this tier found, and their fixes
#: (none is papered over on either side; every launch of these modes must now be identical):
#:
#: * fused-lsa: our recipe built its reduce with ``recv_uncached=False`` where mori's benchmark
#:   passes True -- cached loads of a recv slot that peers' CUs write over xGMI.
#:   kernels/sdma_phases.py passes True for fused-lsa's reduce.
#: * split-sdma, split-lsa: our recipe shared one unfused GEMM built at rank 0 with
#:   sdma_queues=8 (``..._lq8..._r0``) across every rank; mori's benchmark builds it per rank
#:   with the run's queue count (``..._lq1..._r<rank>``). Same machine code, but the rank and
#:   the queue count are in the kernel's name, so the code objects differed.
#:   kernels/gemm_only.py builds the split GEMM per rank with the tuple's queue count.


@pytest.mark.parametrize("sc", BENCH_MODES, ids=[s.name for s in BENCH_MODES])
def test_launch_parity_benchmark_modes(parity, run_candidate, sc):
    """split-sdma, split-lsa, fused-lsa: ours against mori's builders in its benchmark's order."""
    oracle = parity.oracle[sc.name]
    assert oracle["benchmark"].startswith("ROCm/mori benchmark/cco/flydsl/gemm_ar/bench_gemm_ar.py")
    calls = sum(1 for kind, _ in sc.steps if kind == "call")
    self_tests = sum(1 for kind, _ in sc.steps if kind == "self_test")
    assert self_tests and len(oracle["launches"]) == (calls * BENCH_LAUNCHES_PER_CALL[sc.transport]
                                                      + self_tests * BENCH_LAUNCHES_PER_SELF_TEST[sc.transport])
    cand = run_candidate(sc)
    assert all(lch["via_extra"] for lch in cand["launches"])
    _check_identical(oracle, cand)


@pytest.mark.parametrize("sc", [s for s in BENCH_MODES if s.transport.startswith("split-")],
                         ids=[s.name for s in BENCH_MODES if s.transport.startswith("split-")])
def test_split_gemm_is_this_ranks_with_the_runs_queue_count(parity, run_candidate, sc):
    """The split GEMM is mori's benchmark's for this rank and queue count (its name says so), on both sides."""
    cand = run_candidate(sc)
    o, c = compare.canonical_sequence(parity.oracle[sc.name]), compare.canonical_sequence(cand)
    from parity.oracle import OP_SDMA_QUEUES

    gemms = {x.kernel for x in (*o, *c) if x.kernel.startswith("mori_fused_split")}
    assert len(gemms) == 1, gemms
    name = gemms.pop()
    # ..._<tag>l q<queues> s<stripe> p a _r<rank>: linear tile order, this run's queue count, this rank
    assert f"lq{OP_SDMA_QUEUES}s" in name and name.endswith(f"_r{sc.rank}"), name
    assert len({x.digest for x in (*o, *c) if x.kernel.startswith("mori_fused_split")}) == 1


#: One scenario per mode whose op runs a self-test at construction (every GemmAllReduceOp).
CONSTRUCTED = [FUSED[0], *(sc for sc in BENCH_MODES if sc.rank == 0)]


@pytest.mark.parametrize("sc", CONSTRUCTED, ids=[s.name for s in CONSTRUCTED])
def test_constructor_self_test_launches_what_mori_self_test_does(parity, run_candidate, sc):
    """self_test=True (the default) launches the oracle's self-test sequence, then refuses and releases everything.

    The oracle is mori's own ``GemmAllReduceOp.self_test`` at m_max on that shape's window (for
    split-sdma and fused-lsa too: the same SDMA order), and for split-lsa, which mori has no
    self-test for, the benchmark's all-reduce launch at m_max -- never our own records.
    """
    modules = parity.stub.loaded_modules()
    res = run_candidate(sc, construct_self_test=True)
    assert "self-test failed" in res["constructor_error"]
    oracle = parity.oracle[sc.name]
    n = len(res["launches"])
    assert n == (1 if sc.transport == "split-lsa" else 3)  # scatter -> reduce -> gather at m_max
    # the op is gone (its handles with it): compare what does not depend on them
    o = compare.canonical_sequence({"launches": oracle["launches"][:n], "address_map": oracle["address_map"]})
    c = [compare.canonical(lch, {"regions": {}, "handles": {"stream": parity.stream.cuda_stream}})
         for lch in res["launches"]]
    assert [(x.digest, x.kernel, x.grid, x.block, x.shared_mem, x.stream) for x in o] == \
        [(x.digest, x.kernel, x.grid, x.block, x.shared_mem, x.stream) for x in c]
    # window and memory released, modules unloaded; the dev comm stays with the communicator (as in mori)
    assert dict(res["comm"].live_counts) == {"dev_comm": 1} and parity.stub.loaded_modules() == modules


# ---------------------------------------------------------------------------
# the one changed behaviour, undone: mori's first-seen counter slots
# ---------------------------------------------------------------------------


def test_negative_control_first_seen_slots(parity, run_candidate):
    """Without the slot shim mori's kernels differ from ours in exactly the GEMM launches.

    The self-test runs first at m_max, so mori gives m_max counter set 0 where the
    rule gives 1, and the next M gets 1 where the rule gives 0. Only the GEMM has the
    counter offset compiled in; every phase kernel stays byte-identical.
    """
    nc = negative_control()
    first_seen = parity.oracle[nc.name]
    cand = run_candidate(FUSED[0])
    o, c = compare.canonical_sequence(first_seen), compare.canonical_sequence(cand)
    diffs = compare.differences(o, c)
    gemm_at = [i for i, x in enumerate(c) if x.kernel.startswith("mori_fused")]
    assert gemm_at and [i for i, _ in diffs] == gemm_at, compare.explain(o, c)
    assert all(set(fields) <= {"digest", "kernel"} for _i, fields in diffs), compare.explain(o, c)
    # and with the shim, the same op is identical (the control's control)
    _check_identical(parity.oracle[FUSED[0].name], cand)



# ---------------------------------------------------------------------------
# deliberately broken records: the runtime or the parity tier refuses every one
# ---------------------------------------------------------------------------

W2 = FUSED[0]  # world 2, bf16 wire, rank 0


def _at(sc: Scenario):
    def where(t, rank: int) -> bool:
        i = t.id
        return (i.transport, i.world, i.quant, i.gather_dtype, rank) == (sc.transport, sc.world, sc.quant,
                                                                          sc.gather_dtype, sc.rank)
    return where


def _keys(lock, sc: Scenario, kind: str, rank: int | None = None) -> set[str]:
    where = _at(sc)
    rank = sc.rank if rank is None else rank
    return {e.key for t in lock.tuples for r in t.ranks if where(t, sc.rank) and r.rank == rank
            for e in (*r.launches, *r.self_test) if e.kind == kind}


def _swap_a_b(rec: dict) -> dict:
    """The GEMM's A and B pointers swapped: both ``ptr``, same size, same kind -- only their meaning differs."""
    from gemmar_aot.model.launch import LaunchRecord

    return {**rec, "launch": tamper.swap_kernel_args(LaunchRecord.from_json(rec["launch"]), 0, 2).to_json()}


def test_broken_lock_swapped_pointers_is_refused_by_the_runtime(parity, run_candidate):
    from gemmar_aot.model.lock import read_lock
    from gemmar_aot.runtime import ArtifactMismatchError

    lock = read_lock(parity.lock)
    bad = tamper.edit_lock(lock, _at(W2), tamper.map_entries(
        lambda e: replace(e, launch=tamper.swap_kernel_args(e.launch, 0, 2)), kinds=("gemm",)))
    with pytest.raises(ArtifactMismatchError, match=r"the lock and the store disagree about gemm for M=\d+ rank 0 "
                                                    r".*the lock's launch record is not the record's\. Lock: .*"
                                                    r"Store record: "):
        run_candidate(W2, artifacts=(bad, parity.store))


def test_broken_build_swapped_pointers_fails_parity(parity, run_candidate, tmp_path):
    """Lock and store agree on the swapped record (the build wrote it): only mori's op can tell."""
    from gemmar_aot.model.lock import read_lock

    lock = read_lock(parity.lock)
    bad = tamper.rewrite_store(parity.store, tmp_path / "store", lock,
                               {k: _swap_a_b for k in _keys(lock, W2, "gemm")})
    cand = run_candidate(W2, artifacts=(bad, tmp_path / "store"))  # the runtime accepts it: nothing to check
    o, c = compare.canonical_sequence(parity.oracle[W2.name]), compare.canonical_sequence(cand)
    diffs = compare.differences(o, c)
    gemm_at = [i for i, x in enumerate(c) if x.kernel.startswith("mori_fused")]
    assert [i for i, _ in diffs] == gemm_at and all(f == ["args"] for _, f in diffs), compare.explain(o, c)
    assert c[gemm_at[0]].args[0].startswith("b@") and o[gemm_at[0]].args[0].startswith("a@")


def test_broken_lock_another_ranks_phase_kernel_is_refused_by_the_runtime(parity, run_candidate):
    """Rank 1's reduce where rank 0's belongs: same symbol, same arguments, different code."""
    from gemmar_aot.model.lock import read_lock
    from gemmar_aot.runtime import ArtifactMismatchError

    lock = read_lock(parity.lock)

    def use_rank1_reduce(t, r):
        other = next(x for x in t.ranks if x.rank == 1)
        swap = lambda mine, theirs: tuple(b if a.kind == "reduce" else a for a, b in zip(mine, theirs))  # noqa: E731
        return replace(r, launches=swap(r.launches, other.launches), self_test=swap(r.self_test, other.self_test))

    bad = tamper.edit_lock(lock, _at(W2), use_rank1_reduce)
    with pytest.raises(ArtifactMismatchError, match=r"disagree about reduce .* the record compiled rank 1 "
                                                    r"\(the lock launches it as 0\)"):
        run_candidate(W2, artifacts=(bad, parity.store))


def test_broken_build_another_ranks_phase_kernel_fails_parity(parity, run_candidate, tmp_path):
    """The build labelled rank 1's reduce as rank 0's, in the record and the lock alike."""
    from gemmar_aot.model.lock import read_lock

    lock = read_lock(parity.lock)
    r1_reduce = _keys(lock, W2, "reduce", rank=1)

    def relabel(rec: dict) -> dict:
        return {**rec, "spec": {**rec["spec"], "rank": 0}}

    def use_rank1_reduce(t, r):
        other = next(x for x in t.ranks if x.rank == 1)
        swap = lambda mine, theirs: tuple(b if a.kind == "reduce" else a for a, b in zip(mine, theirs))  # noqa: E731
        return replace(r, launches=swap(r.launches, other.launches), self_test=swap(r.self_test, other.self_test))

    relabelled = tamper.edit_lock(lock, _at(W2), use_rank1_reduce)
    bad = tamper.rewrite_store(parity.store, tmp_path / "store", relabelled, {k: relabel for k in r1_reduce})
    cand = run_candidate(W2, artifacts=(bad, tmp_path / "store"))
    o, c = compare.canonical_sequence(parity.oracle[W2.name]), compare.canonical_sequence(cand)
    diffs = compare.differences(o, c)
    reduce_at = [i for i, x in enumerate(c) if x.kernel.startswith("sdma_reduce")]
    assert [i for i, _ in diffs] == reduce_at and all(f == ["digest"] for _, f in diffs), compare.explain(o, c)


def test_broken_build_wrong_block_is_refused_by_the_runtime(parity, run_candidate, tmp_path):
    """A GEMM record launching 256 threads where the code object was compiled for exactly 512."""
    from gemmar_aot.model.lock import read_lock
    from gemmar_aot.runtime import ArtifactMismatchError

    def half_block(rec: dict) -> dict:
        return {**rec, "launch": {**rec["launch"], "block": [256, 1, 1]}}

    lock = read_lock(parity.lock)
    bad = tamper.rewrite_store(parity.store, tmp_path / "store", lock,
                               {k: half_block for k in _keys(lock, W2, "gemm")})
    with pytest.raises(ArtifactMismatchError, match=r"block \[256, 1, 1\], the kernel was compiled for exactly "
                                                    r"\[512, 1, 1\] \(reqd_workgroup_size\)"):
        run_candidate(W2, artifacts=(bad, tmp_path / "store"))
