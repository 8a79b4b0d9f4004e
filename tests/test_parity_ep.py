"""Launch parity at the HIP ABI for mori's EP dispatch/combine v2: mori's own op against ours.

The oracle is mori's ``EpDispatchCombineOpFlyDSL`` from the toolchain's sources, run by FlyDSL in
its normal mode in a process of its own (tests/parity/oracle.py ``_run_ep``; its shims, 7-10,
are listed with why in tests/parity/shims.py): it compiles each variant on its first call, loads
it through FlyDSL's runtime and launches it with ``kernelParams``. The candidate is
``gemmar_aot.runtime.EpDispatchCombineOp`` loading what ``gemmar-aot build`` compiled from an
``[[ep]]`` manifest, through the real ctypes ``HipDriver``. Both run the same calls
(tests/parity/ep_scenario.py: every bucket of MI355X's schedule, replay, the local expert count,
StdMoE's converts, ``reset``; worlds 2, 4 and 8; bf16, fp32, fp8 e4m3fn/fnuz, fp4, asymmetric,
both scatter quants) against the same HIP double and communicator double, and every launch --
code object sha256, symbol, grid, block, LDS, stream, argument bytes with addresses named by the
buffer they point into -- must be identical. The oracle never reads what our build recorded.

The default profile (amd-mori 1.2.4) runs every scenario; the nightly profile (1.2.5.dev, whose
combines changed) runs three. Set GEMMAR_AOT_TEST_PARITY_DIR to keep the stores and the
oracle's records between sessions (reused only for identical inputs).
"""

from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass, replace
from pathlib import Path

import pytest

from parity import candidate, compare, shims
from parity.ep_scenario import EpOperands, EpScenario, ep_manifest_toml, ep_scenarios
from parity.runner import start_oracle

pytestmark = [pytest.mark.parity, pytest.mark.compile]

SCENARIOS = ep_scenarios()
BY_NAME = {s.name: s for s in SCENARIOS}
#: Under the nightly profile: the gather combine (its bytes changed), a scatter quant and StdMoE.
NIGHTLY = [BY_NAME[n] for n in ("ep-w2-bf16-buckets-r1", "ep-w2-scatter-fp8-blockwise-r0", "ep-w2-stdmoe-r0")]
#: MI355X's single-shot geometry (mori 1.2.4 tuning_configs.py), which the oracle resolves under shim 7.
MI355X_GEOMETRY = [128, 16, 48, 16]


@dataclass
class EpParityRun:
    profile: str
    oracle: dict  # scenario name -> the oracle's record
    store: Path
    lock: Path
    stub: object
    stub_path: str
    stream: shims.StreamDouble
    build: dict


@contextlib.contextmanager
def _profile(name: str):
    """The oracle process and the toolchain digest read the profile from the environment."""
    old = os.environ.get("GEMMAR_AOT_TOOLCHAIN_PROFILE")
    os.environ["GEMMAR_AOT_TOOLCHAIN_PROFILE"] = name
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("GEMMAR_AOT_TOOLCHAIN_PROFILE", None)
        else:
            os.environ["GEMMAR_AOT_TOOLCHAIN_PROFILE"] = old


def _run(profile: str, scenarios: list[EpScenario], hipstub_lib, hip_stub, tmp_path_factory) -> EpParityRun:
    """One oracle process beside one candidate build of the scenarios' manifest, under ``profile``."""
    from gemmar_aot.builder.pipeline import run_build

    keep = os.environ.get("GEMMAR_AOT_TEST_PARITY_DIR")
    work = (Path(keep) / f"ep-{profile}") if keep else tmp_path_factory.mktemp(f"parity-ep-{profile}")
    work.mkdir(parents=True, exist_ok=True)
    manifest = work / "parity-ep.toml"
    manifest.write_text(ep_manifest_toml(scenarios))
    with _profile(profile):
        job = start_oracle(scenarios, hipstub_lib, work, reuse=bool(keep), extra_inputs=f"ep {profile}")
        try:
            build = run_build(manifest, store=work / "store", jobs=2, progress=False, toolchain_profile=profile)
            oracle = job.wait()
        finally:
            job.kill()
    assert not build["failures"], build["failures"]
    return EpParityRun(profile, oracle, work / "store", Path(build["lock_file"]), hip_stub, str(hipstub_lib),
                       shims.StreamDouble(hip_stub), build)


@pytest.fixture(scope="session")
def ep_parity(hipstub_lib, hip_stub, tmp_path_factory) -> EpParityRun:
    return _run("default", SCENARIOS, hipstub_lib, hip_stub, tmp_path_factory)


@pytest.fixture(scope="session")
def ep_parity_nightly(hipstub_lib, hip_stub, tmp_path_factory) -> EpParityRun:
    from gemmar_aot.toolchain import load_toolchain

    try:
        load_toolchain(profile="nightly")
    except Exception as exc:  # noqa: BLE001 - an environment without the nightly profile installed
        pytest.skip(f"the nightly toolchain profile is not installed ({exc}); make setup installs it")
    return _run("nightly", NIGHTLY, hipstub_lib, hip_stub, tmp_path_factory)


def _candidate(run: EpParityRun, monkeypatch, sc: EpScenario, artifacts=None) -> dict:
    shims.install_stream_shim(run.stub, monkeypatch, stream=run.stream)
    res = candidate.run_ep(sc, artifacts=run.lock if artifacts is None else artifacts, stub=run.stub,
                           stub_path=run.stub_path, stream=run.stream)
    res["op"].close()
    return res


def _check_identical(oracle: dict, cand: dict) -> None:
    o, c = compare.canonical_sequence(oracle), compare.canonical_sequence(cand)
    assert compare.differences(o, c) == [], compare.explain(o, c)


def _launching_steps(sc: EpScenario) -> int:
    return sum(1 for kind, _n in sc.steps if kind not in ("reset",))


# ---------------------------------------------------------------------------
# the oracle is mori's own op, through FlyDSL's launch path, on MI355X's table
# ---------------------------------------------------------------------------


def test_ep_oracle_is_moris_op_through_flydsls_launch_path(ep_parity):
    for name, res in ep_parity.oracle.items():
        sc = BY_NAME[name]
        assert len(res["launches"]) == _launching_steps(sc), name  # one launch per call, none at construction
        assert not any(lch["via_extra"] for lch in res["launches"]), name  # FlyDSL hands HIP kernelParams
        assert {lch["stream"] for lch in res["launches"]} == {res["address_map"]["handles"]["stream"]}, name
        assert res["geometry"] == MI355X_GEOMETRY, (name, res["geometry"])  # the table of the device shim 7 names


# ---------------------------------------------------------------------------
# parity, every scenario (default profile) and three under the nightly
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("sc", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_ep_launch_parity(ep_parity, monkeypatch, sc):
    """Same kernels, symbols, grids, blocks, LDS, streams and argument bytes, call by call, and the
    same shapes returned."""
    oracle = ep_parity.oracle[sc.name]
    cand = _candidate(ep_parity, monkeypatch, sc)
    assert all(lch["via_extra"] for lch in cand["launches"])  # ours: the real HipDriver, through extra
    _check_identical(oracle, cand)
    assert cand["said"] == oracle["said"]


@pytest.mark.parametrize("sc", NIGHTLY, ids=[s.name for s in NIGHTLY])
def test_ep_launch_parity_nightly(ep_parity_nightly, monkeypatch, sc):
    cand = _candidate(ep_parity_nightly, monkeypatch, sc)
    _check_identical(ep_parity_nightly.oracle[sc.name], cand)
    assert cand["said"] == ep_parity_nightly.oracle[sc.name]["said"]


def test_ep_nightly_combines_are_other_code_objects(ep_parity, ep_parity_nightly):
    """The control of the nightly tier: its gather combines are not 1.2.4's (mori removed their
    total_recv reset), so the two profiles' records cannot stand in for each other."""
    name = "ep-w2-bf16-buckets-r1"
    digests = [{lch["digest"] for lch in r.oracle[name]["launches"] if lch["kernel"].startswith("ep_combine")}
               for r in (ep_parity, ep_parity_nightly)]
    assert digests[0] and digests[1] and not digests[0] & digests[1]


#: mori's combine ``run`` (intranode_kernels.py, both releases): ``(arena, addr_tok_map, addr_comb_bar,
#: addr_xdb_flag, addr_total_recv, ...)``; the dispatch's ``(arena, addr_inp_tok, addr_inp_idx,
#: addr_inp_wts, addr_tok_map, addr_dest_pe_ctr, addr_disp_bar, addr_total_recv, ...)``.
COMBINE_COUNT_ARG, DISPATCH_COUNT_ARG = 4, 7


def _combine_writes_its_count(profile: str) -> bool:
    """Whether this profile's mori's combine writes 0 at its receive count: its ``make_combine`` takes
    ``reset_total_recv`` (read from mori's own source; 1.2.4's stores 0 there when it is set, which its
    backend always passes)."""
    import ast

    from test_profiles import _installed

    src = _installed(profile).mori_pkg / "ops" / "dispatch_combine_v2" / "intranode_kernels.py"
    (f,) = [f for f in ast.parse(src.read_text()).body if isinstance(f, ast.FunctionDef) and f.name == "make_combine"]
    return "reset_total_recv" in {a.arg for a in f.args.args + f.args.kwonlyargs}


class _CountingDouble:
    """The HIP double, plus what mori's kernels do to the receive count (test double of the kernels'
    effect, stated from mori's source): a dispatch writes how many tokens it received at its count
    address; a combine reads the count at its address and, on a mori whose combine resets it, writes 0
    there. Records the (address, value read) of each combine."""

    def __new__(cls, locks, zeroes: bool, received: list[int]):
        import ctypes

        from fakes import FakeHipDriver

        class Driver(FakeHipDriver):
            def launch(self, function, grid, block, args, stream):
                super().launch(function, grid, block, args, stream)
                lch = self.launches[-1]
                if "combine" in lch.kinds:
                    count = ctypes.c_int32.from_address(lch.args[COMBINE_COUNT_ARG])
                    self.combines.append((lch.args[COMBINE_COUNT_ARG], count.value))
                    if zeroes:
                        count.value = 0
                elif "dispatch" in lch.kinds:
                    ctypes.c_int32.from_address(lch.args[DISPATCH_COUNT_ARG]).value = received.pop(0)

        d = Driver(list(locks))
        d.combines = []
        return d


@pytest.mark.parametrize("profile", ["default", "nightly"])
def test_ep_snapshot_handles_keep_their_count_through_combine_on_either_moris_artifacts(request, profile):
    """Two snapshot dispatches, then their two combines: each combine reads its own handle's count,
    and each handle still says what its dispatch received afterwards. On 1.2.4's artifacts, whose
    combine zeroes the count it reads, that combine is passed a copy; on 1.2.5's, the handle's own."""
    import torch

    from fakes import FakeCommunicator
    from gemmar_aot.model.lock import read_lock
    from gemmar_aot.runtime import EpDispatchCombineConfig, EpDispatchCombineOp

    run = request.getfixturevalue("ep_parity" if profile == "default" else "ep_parity_nightly")
    sc = BY_NAME["ep-w2-bf16-buckets-r1"]
    zeroes = _combine_writes_its_count(profile)
    assert zeroes == (profile == "default")
    driver = _CountingDouble([read_lock(run.lock)], zeroes, received=[37, 21])
    kw = {k: v for k, v in sc.mori_config(torch).items() if k != "kernel_backend"}
    ops = EpOperands(sc)
    with EpDispatchCombineOp(EpDispatchCombineConfig(**kw), FakeCommunicator(sc.rank, sc.world), artifacts=run.lock,
                             driver=driver) as op:
        handles = [op.dispatch(*ops.dispatch(n), return_routing=True, snapshot=True)[-1] for n in (10, 20)]
        assert [int(h.total_recv_token_num) for h in handles] == [37, 21]
        for h, n in zip(handles, (10, 20)):
            op.combine(ops.combine_input(op, n), routing=h)
        assert [value for _addr, value in driver.combines] == [37, 21]  # each combine read its handle's count
        own = [h.total_recv_token_num.data_ptr() for h in handles]
        if zeroes:
            assert not {addr for addr, _v in driver.combines} & set(own)  # the copy was zeroed, not the handle
        else:
            assert [addr for addr, _v in driver.combines] == own
        assert [int(h.total_recv_token_num) for h in handles] == [37, 21]


# ---------------------------------------------------------------------------
# what the tier covers, stated against mori's own records
# ---------------------------------------------------------------------------


def test_ep_every_bucket_launches_its_schedule_variant(ep_parity):
    """Each dispatch and combine runs the (blocks, warps) of its token count's bucket in the
    schedule mori resolved: every bucket of the table is exercised."""
    sc = BY_NAME["ep-w2-bf16-buckets-r0"]
    res = ep_parity.oracle[sc.name]
    sched = res["schedule"]
    seen = set()
    for (kind, n), lch in zip([s for s in sc.steps if s[0] != "reset"], res["launches"]):
        if kind not in ("dispatch", "combine", "replay", "plain"):
            continue
        bucket = next(b for b in sched if b[0] is None or n <= b[0])
        want = (bucket[1], bucket[2]) if kind != "combine" else (bucket[3], bucket[4])
        assert (lch["grid"][0], lch["block"][0] // 64) == want, (kind, n, lch["grid"], lch["block"])
        seen.add(sched.index(bucket))
    assert seen == set(range(len(sched)))


def test_ep_replay_runs_its_own_prebuilt_variant(ep_parity, monkeypatch):
    """A replay dispatch is another code object than the plain one of its bucket (mori builds it on
    the first replay call; ours was built ahead), the same one on both sides."""
    sc = BY_NAME["ep-w2-bf16-buckets-r0"]
    cand = _candidate(ep_parity, monkeypatch, sc)
    steps = [s for s in sc.steps if s[0] != "reset"]
    at = {s: i for i, s in reversed(list(enumerate(steps)))}
    replay, first = cand["launches"][at[("replay", 64)]], cand["launches"][at[("dispatch", 64)]]
    assert replay["kernel"] == first["kernel"] == "ep_dispatch_0" and replay["digest"] != first["digest"]
    assert (replay["grid"], replay["block"]) == (first["grid"], first["block"])
    oracle = ep_parity.oracle[sc.name]["launches"]
    assert (oracle[at[("replay", 64)]]["digest"], oracle[at[("dispatch", 64)]]["digest"]) == \
        (replay["digest"], first["digest"])


def test_ep_negative_control_another_rank_differs_in_every_launch(ep_parity, monkeypatch):
    """Rank 1's op against rank 0's oracle: the rank is compiled in and passed, so every launch
    differs -- the comparison can tell ranks apart although every rank's symbol is the same."""
    r0, r1 = BY_NAME["ep-w2-bf16-buckets-r0"], BY_NAME["ep-w2-bf16-buckets-r1"]
    cand = _candidate(ep_parity, monkeypatch, r1)
    o, c = compare.canonical_sequence(ep_parity.oracle[r0.name]), compare.canonical_sequence(cand)
    diffs = compare.differences(o, c)
    assert len(diffs) == len(o) and all("digest" in f for _i, f in diffs), compare.explain(o, c)
    assert [x.kernel for x in o] == [x.kernel for x in c]
    _check_identical(ep_parity.oracle[r1.name], cand)  # and the control's control


# ---------------------------------------------------------------------------
# what the pod is told instead of a compile
# ---------------------------------------------------------------------------


def test_ep_over_capacity_config_miss_and_device_table_are_refused(ep_parity, monkeypatch):
    """Above the capacity: mori's ValueError plus the [[ep]] entry that serves it; a config the lock
    does not hold: ArtifactMissingError with its [[ep]] block; a config resolved to another
    table: refused naming both tables."""
    import torch

    from gemmar_aot.runtime import (ArtifactMismatchError, ArtifactMissingError, EpDispatchCombineConfig,
                                    EpDispatchCombineOp)
    from gemmar_aot.runtime.hip import HipDriver

    shims.install_stream_shim(ep_parity.stub, monkeypatch, stream=ep_parity.stream)
    from fakes import FakeCommunicator

    sc = BY_NAME["ep-w2-stdmoe-r0"]
    kw = {k: v for k, v in sc.mori_config(torch).items() if k != "kernel_backend"}
    driver = HipDriver(ep_parity.stub_path)
    with EpDispatchCombineOp(EpDispatchCombineConfig(**kw), FakeCommunicator(0, 2), artifacts=ep_parity.lock,
                             driver=driver) as op:
        x = torch.zeros(sc.max_tokens + 1, sc.hidden, dtype=torch.bfloat16)
        with pytest.raises(ValueError, match=rf"{sc.max_tokens + 1} tokens exceeds max_num_inp_token_per_rank="
                                             rf"{sc.max_tokens}(.|\n)*max_tokens = {sc.max_tokens + 1}"):
            op.dispatch(x, None, None, torch.zeros(sc.max_tokens + 1, sc.topk, dtype=torch.int32))
    with pytest.raises(ArtifactMissingError, match=r"no precompiled EP kernels(.|\n)*\[\[ep\]\](.|\n)*hidden = 2048"):
        EpDispatchCombineOp(EpDispatchCombineConfig(**{**kw, "hidden_dim": 2048}), FakeCommunicator(0, 2),
                            artifacts=ep_parity.lock, driver=driver)
    with pytest.raises(ArtifactMismatchError, match=r"resolved geometry \[64, 16, 80, 4\](.|\n)*MI355X's table"):
        EpDispatchCombineOp(EpDispatchCombineConfig(**{**kw, "dispatch_block_num": 64}), FakeCommunicator(0, 2),
                            artifacts=ep_parity.lock, driver=driver)


def test_ep_scenario_table_covers_what_the_issue_names():
    """Worlds 2/4/8, each dtype mori serves, both combine modes, StdMoE, replay and reset."""
    assert {s.world for s in SCENARIOS} == {2, 4, 8}
    assert {s.dispatch_dtype for s in SCENARIOS} == {"bf16", "fp32", "fp8_e4m3fn", "fp8_e4m3fnuz", "fp4"}
    assert {s.quant_type for s in SCENARIOS} == {"none", "fp8_direct_cast", "fp8_blockwise"}
    assert any(s.combine != s.dispatch_dtype for s in SCENARIOS) and any(s.std_moe for s in SCENARIOS)
    kinds = {k for s in SCENARIOS for k, _n in s.steps}
    assert kinds == {"dispatch", "plain", "replay", "combine", "lec", "convert_dispatch", "convert_combine", "reset"}
    assert replace(SCENARIOS[0], rank=1).manifest_entry() == SCENARIOS[0].manifest_entry()
