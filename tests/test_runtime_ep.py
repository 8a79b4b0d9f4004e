"""The EP op in a pod: gemmar_aot.runtime.EpDispatchCombineOp on the smoke store's [[ep]] entry.

With the HIP double (tests/fakes.FakeHipDriver: every launch checked against the code object's own
metadata note, the roles its kernel's own name allows) and the communicator double. Launch parity
with mori's own op is tests/test_parity_ep.py; here: what a pod imports, what it is told instead
of a compile, what a lock edit meets, and that nothing leaks when construction fails.
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from click.testing import CliRunner

from fakes import FakeCommunicator, FakeHipDriver, InjectedFailure
from gemmar_aot.runtime import (ArtifactMismatchError, ArtifactMissingError, EpDispatchCombineConfig,
                                EpDispatchCombineOp)
from gemmar_aot.runtime.misses import read_reports

ROOT = Path(__file__).resolve().parents[1]
#: The smoke manifest's [[ep]] entry, as a pod's config.
SMOKE_EP = dict(world_size=2, hidden_dim=1024, max_num_inp_token_per_rank=128, num_experts_per_rank=4,
                num_experts_per_token=2)


def _cfg(rank=0, **kw):
    return EpDispatchCombineConfig(rank=rank, **{**SMOKE_EP, **kw})


def _op(artifacts, smoke_lock, rank=0, comm=None, **kw):
    """The op on ``artifacts`` (a store, or a (lock, store) pair), with a HIP double that loads only
    what the smoke lock names."""
    driver = FakeHipDriver([smoke_lock])
    op = EpDispatchCombineOp(_cfg(rank, **kw), comm or FakeCommunicator(rank, 2), artifacts=artifacts, driver=driver)
    return op, driver


def _tokens(n, hidden=1024, topk=2):
    return (torch.zeros(n, hidden, dtype=torch.bfloat16), torch.zeros(n, topk), None,
            torch.zeros(n, topk, dtype=torch.int32))


def test_a_pod_constructs_the_ep_op_from_the_lock_and_imports_no_compiler(smoke_store):
    """``from gemmar_aot.runtime import EpDispatchCombineOp`` constructs with the test doubles and
    serves a round trip in a process that never imports FlyDSL, MLIR or mori's ops."""
    code = textwrap.dedent(f"""
        import sys, torch
        sys.path.insert(0, {str(ROOT / 'tests')!r})
        from fakes import FakeCommunicator, FakeHipDriver
        from gemmar_aot.runtime import EpDispatchCombineOp, EpDispatchCombineConfig
        cfg = EpDispatchCombineConfig(rank=1, world_size=2, hidden_dim=1024, max_num_inp_token_per_rank=128,
                                      num_experts_per_rank=4, num_experts_per_token=2)
        op = EpDispatchCombineOp(cfg, FakeCommunicator(1, 2), artifacts={str(smoke_store)!r}, driver=FakeHipDriver())
        x = torch.zeros(64, 1024, dtype=torch.bfloat16)
        *_, handle = op.dispatch(x, torch.zeros(64, 2), None, torch.zeros(64, 2, dtype=torch.int32),
                                 return_routing=True)
        op.combine(torch.zeros(128, 1024, dtype=torch.bfloat16), routing=handle)
        op.close()
        bad = sorted(m for m in sys.modules if m.split(".")[0] in ("flydsl", "mlir", "_mlir")
                     or m.startswith(("mori.ops", "gemmar_aot.compiler", "gemmar_aot.builder", "gemmar_aot_kernels",
                                      "gemmar_aot.toolchain")))
        print(bad)
    """)
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "[]"


def test_every_kernel_of_the_rank_is_loaded_and_each_call_launches_mori_s_pick(smoke_store, smoke_lock):
    op, driver = _op(smoke_store, smoke_lock, rank=1)
    # mori 1.2.4's MI355X table for an untuned shape (tuning_configs.py SCHED_BF16): 4 dispatch and
    # 4 combine variants, their 4 replays, the local expert count; its first bucket (<= 128
    # tokens) runs dispatch (128 blocks, 8 warps) and combine (32 blocks, 8 warps)
    assert driver.counters["load_module"] == 13  # replay variants too: nothing lazy
    for n in (1, 64, 128):
        x, w, s, idx = _tokens(n)
        *views, handle = op.dispatch(x, w, s, idx, return_routing=True)
        assert [None if v is None else tuple(v.shape) for v in views] == [(256, 1024), (256, 2), None, (256, 2), (1,)]
        op.local_expert_count()
        out, outw = op.combine(torch.zeros(n * 2, 1024, dtype=torch.bfloat16), w, routing=handle)
        assert out.shape == (n, 1024) and outw.shape == (n, 2)
        op.dispatch(x, w, s, idx, routing=handle)
    (db, dw), cb = (128, 8), 32
    driver.assert_roles(["dispatch", "local_expert_count", "combine", "dispatch_replay"] * 3)
    disp = driver.launched("dispatch")
    assert all(l.grid == (db, 1, 1) and l.block == (dw * 64, 1, 1) for l in disp)
    assert all(l.grid == (cb, 1, 1) for l in driver.launched("combine"))
    assert disp[0].args[9:] == (1, 1) and disp[-1].args[9:] == (1, 128)  # this rank, this call's token count
    assert disp[0].args[0] == op.win.handle
    assert disp[0].digest != disp[1].digest  # dispatch and its replay: two code objects of one symbol
    op.close()


def test_a_dispatch_above_the_capacity_is_refused_with_the_entry_that_serves_it(smoke_store, smoke_lock, tmp_path):
    report = tmp_path / "misses.jsonl"
    driver = FakeHipDriver([smoke_lock])
    with EpDispatchCombineOp(_cfg(), FakeCommunicator(0, 2), artifacts=smoke_store, driver=driver,
                             miss_report=report) as op:
        with pytest.raises(ValueError, match=r"129 tokens exceeds max_num_inp_token_per_rank=128(.|\n)*"
                                             r"\[\[ep\]\]\nworld = 2\nhidden = 1024\nmax_tokens = 129\n"):
            op.dispatch(*_tokens(129))
        assert op.stats()["misses"] == {129: 1} and not driver.launches
    (line,), _ = read_reports([report])
    assert line["op"] == "EpDispatchCombineOp" and line["tuple"] is None and line["m"] == 129
    assert line["ep"]["max_tokens"] == 128 and line["ep"]["world"] == 2


@pytest.mark.parametrize("change, error, match", [
    ({"gpu_per_node": 1}, ValueError, r"gpu_per_node=1 < world_size=2 selects the internode path"),
    ({"data_type": torch.float8_e4m3fn, "combine_mode": "scatter"}, ValueError,
     r"flydsl backend cannot serve this config:\n  plain fp4/fp8 token dtype is gather-only"),
    ({"data_type": torch.float16}, ValueError, r"torch.float16: mori's EP FlyDSL backend moves"),
    ({"hidden_dim": 2048}, ArtifactMissingError, r"no precompiled EP kernels for EP world 2 hidden 2048(.|\n)*"
                                                 r"\[\[ep\]\]\nworld = 2\nhidden = 2048"),
    ({"max_num_inp_token_per_rank": 256}, ArtifactMissingError, r"max_tokens = 256"),
    ({"combine_block_num": 64}, ArtifactMismatchError, r"resolved geometry \[64, 16, 64, 4\] and schedule None"),
    ({"kernel_backend": "cuda"}, ValueError, r"unknown kernel backend 'cuda' \(the config's kernel_backend\); "
                                             r"known: \['flydsl', 'hip'\]"),
], ids=["internode", "mori-refuses", "dtype", "hidden", "capacity", "pinned-geometry", "unknown-backend"])
def test_a_config_the_lock_cannot_serve_is_refused_before_anything_is_acquired(smoke_store, smoke_lock, change, error,
                                                                                match):
    comm = FakeCommunicator(0, 2)
    driver = FakeHipDriver([smoke_lock])
    with pytest.raises(error, match=match):
        EpDispatchCombineOp(_cfg(**change), comm, artifacts=smoke_store, driver=driver)
    assert not comm.acquired and not driver.counters["load_module"]


class _HipOp:
    """What ``ep_hip.hip_op`` was asked for (mori's HIP op itself needs a GPU: tests/test_jitv2*.py run it
    on the HIP double in a process of its own)."""

    def __init__(self, cfg, comm, **kw):
        self.cfg, self.comm, self.kw = cfg, comm, kw


@pytest.mark.parametrize("change", [{"kernel_backend": "hip"}, {"kernel_backend": "hip", "gpu_per_node": 1}],
                         ids=["intranode", "internode"])
def test_the_hip_backend_is_moris_own_op_with_its_jit_v2_kernels_served(smoke_store, smoke_lock, monkeypatch, change):
    """A config that selects mori's HIP backend (every internode config must) gets mori's own HIP op with its
    JIT v2 cache served (ep_hip.hip_op), with the op's artifacts, keys and miss report; nothing of the
    FlyDSL path is acquired."""
    from gemmar_aot.runtime import ep_hip

    monkeypatch.setattr(ep_hip, "hip_op", _HipOp)
    comm, driver = FakeCommunicator(0, 2), FakeHipDriver([smoke_lock])
    op = EpDispatchCombineOp(_cfg(**change), comm, artifacts=smoke_store, driver=driver, miss_report="m.jsonl")
    assert isinstance(op, _HipOp) and op.comm is comm
    assert op.kw == {"artifacts": smoke_store, "driver": driver, "trusted_keys": None, "miss_report": "m.jsonl"}
    assert not comm.acquired and not driver.counters["load_module"]


def test_moris_backend_variable_is_read_as_mori_reads_it(smoke_store, smoke_lock, monkeypatch):
    """$MORI_V2_KERNEL_BACKEND selects the backend when the config names none; the config's wins."""
    from gemmar_aot.runtime import ep_hip

    monkeypatch.setattr(ep_hip, "hip_op", _HipOp)
    monkeypatch.setenv("MORI_V2_KERNEL_BACKEND", "hip")
    assert isinstance(EpDispatchCombineOp(_cfg(), FakeCommunicator(0, 2), artifacts=smoke_store), _HipOp)
    _op(smoke_store, smoke_lock, kernel_backend="flydsl")[0].close()


def test_the_communicator_must_be_the_configs_rank(smoke_store, smoke_lock):
    with pytest.raises(ValueError, match=r"the config is rank 0 of world 2, the communicator rank 1 of 2"):
        _op(smoke_store, smoke_lock, rank=0, comm=FakeCommunicator(1, 2))


def _edited(lock, edit):
    """``lock`` with its EP entry's ranks changed by ``edit(ranks)``."""
    ep = lock.eps[0]
    return replace(lock, eps=(replace(ep, ranks=edit(ep.ranks)),))


def test_a_lock_edit_is_refused_naming_what_the_record_compiled(smoke_store, smoke_lock):
    r0, r1 = smoke_lock.eps[0].ranks

    def swap_first_two(ranks):  # two dispatch variants in each other's place: same kind, other geometry
        l0 = list(ranks[0].launches)
        l0[0], l0[1] = l0[1], l0[0]
        return (replace(ranks[0], launches=tuple(l0)), ranks[1])

    with pytest.raises(ArtifactMismatchError, match=r"disagree about EP dispatch \(96 blocks x 8 warps\) rank 0 "
                                                    r"(.|\n)*block_num 128 \(the lock launches it as 96\)"):
        _op((_edited(smoke_lock, swap_first_two), smoke_store), smoke_lock)
    with pytest.raises(ArtifactMismatchError, match=r"the record compiled rank 1 \(the lock launches it as 0\)"):
        _op((_edited(smoke_lock, lambda ranks: (replace(r1, rank=0), r1)), smoke_store), smoke_lock)

    def drop_lec(ranks):
        return (replace(ranks[0], launches=ranks[0].launches[:-1]), ranks[1])

    with pytest.raises(ArtifactMismatchError, match=r"its EP configuration makes \[.*'local_expert_count'\]"):
        _op((_edited(smoke_lock, drop_lec), smoke_store), smoke_lock)


@pytest.mark.parametrize("step", ["alloc_mem", "register_window", "barrier"])
def test_a_failure_while_acquiring_releases_everything(smoke_store, smoke_lock, step):
    comm = FakeCommunicator(0, 2, fail_at={step})
    driver = FakeHipDriver([smoke_lock])
    with pytest.raises(InjectedFailure):
        EpDispatchCombineOp(_cfg(), comm, artifacts=smoke_store, driver=driver)
    assert not comm.live and not driver.loaded and driver.counters["load_module"] == 13


def test_reset_zeroes_the_window_and_the_counters_then_waits_for_every_rank(smoke_store, smoke_lock):
    comm = FakeCommunicator(0, 2)
    op, driver = _op(smoke_store, smoke_lock, comm=comm)
    assert driver.memsets == [(op.mem.ptr, 0, op.window_bytes)] and comm.barriers == 1  # ready: zeroed, then waited
    op.total_recv.fill_(7)
    op.token_dest_map.fill_(3)
    op.cross_device_flag.fill_(9)
    op.reset()
    assert driver.memsets[-1] == (op.mem.ptr, 0, op.window_bytes) and comm.barriers == 2 and driver.syncs
    assert int(op.total_recv) == 0 and bool((op.token_dest_map == -1).all()) and bool((op.cross_device_flag == 1).all())
    op.close()
    assert not comm.live and not driver.loaded
    with pytest.raises(RuntimeError, match="closed"):
        op.dispatch(*_tokens(1))


@pytest.mark.compile
def test_suggest_turns_an_ep_miss_into_the_entry_that_serves_it(tmp_path):
    """A pod configured for 256 tokens a rank finds only a 128-token build: its miss, `suggest
    --write`, a real build of the edited manifest, and the same pod constructs with no miss."""
    from gemmar_aot.builder.pipeline import run_build
    from gemmar_aot.cli import main
    from gemmar_aot.model.lock import read_lock

    manifest = tmp_path / "ep.toml"
    manifest.write_text('[manifest]\nname = "ep"\narch = "gfx950"\n\n[[ep]]\nworld = 2\nhidden = 512\n'
                        'max_tokens = 128\nexperts = 4\ntopk = 2\ndispatch_dtype = "bf16"\ndevice = "MI355X"\n'
                        'replay = false\n')
    store, report = tmp_path / "store", tmp_path / "misses.jsonl"
    assert run_build(manifest, store=store, jobs=2, progress=False)["failed"] == 0

    def construct():
        lock = read_lock(store / "locks" / "ep.lock.json")
        cfg = EpDispatchCombineConfig(rank=0, world_size=2, hidden_dim=512, max_num_inp_token_per_rank=256,
                                      num_experts_per_rank=2, num_experts_per_token=2)
        EpDispatchCombineOp(cfg, FakeCommunicator(0, 2), artifacts=store, driver=FakeHipDriver([lock]),
                            miss_report=report).close()

    with pytest.raises(ArtifactMissingError, match="max_tokens = 256"):
        construct()
    r = CliRunner().invoke(main, ["suggest", str(report), "--manifest", str(manifest), "--write"])
    assert r.exit_code == 0, r.output
    assert "[[ep]]" in manifest.read_text() and "max_tokens = 256" in manifest.read_text()
    assert run_build(manifest, store=store, jobs=2, progress=False)["failed"] == 0
    before = len(read_reports([report])[0])
    construct()
    assert len(read_reports([report])[0]) == before
    r = CliRunner().invoke(main, ["suggest", str(report), "--manifest", str(manifest), "--json"])
    out = json.loads(r.stdout)
    assert out["snippet"] == "" and out["already_built"][0]["ep"]["max_tokens"] == 256


# ---------------------------------------------------------------- a pod that changes no code

#: Test double of ``mori.ops.dispatch_combine_v2``'s eager ``__init__``: mori's config and handle
#: names as plain classes (the op reads a config by its fields), and an op that must never be used.
_FAKE_EP_INIT = textwrap.dedent("""
    from dataclasses import dataclass

    @dataclass
    class EpDispatchCombineConfig:          # mori's field names; resolved as mori resolves on an MI355X
        rank: int
        world_size: int
        hidden_dim: int
        max_num_inp_token_per_rank: int
        num_experts_per_rank: int
        num_experts_per_token: int
        data_type: object = "torch.bfloat16"
        dispatch_block_num: int = 128
        warp_num_per_block: int = 16
        combine_block_num: int = 48
        combine_warp_num_per_block: int = 16
        schedule: tuple = ((128, 128, 8, 32, 8), (256, 96, 8, 64, 8), (1024, 96, 8, 32, 16),
                           (4096, 160, 8, 32, 16), (None, 128, 16, 48, 16))

    class EpDispatchRoutingHandle:
        pass

    class EpDispatchCombineOp:
        def __init__(self, *a, **kw):
            raise RuntimeError("test double: mori's JIT op was constructed")
""")

_EP_SERVER = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {tests!r})
    import site
    site.addsitedir({pth_dir!r})
    from mori.ops.dispatch_combine_v2 import EpDispatchCombineConfig, EpDispatchCombineOp   # what the server does
    from fakes import FakeCommunicator, FakeHipDriver
    import torch
    cfg = EpDispatchCombineConfig(rank=0, world_size=2, hidden_dim=1024, max_num_inp_token_per_rank=128,
                                  num_experts_per_rank=4, num_experts_per_token=2)
    op = EpDispatchCombineOp(cfg, FakeCommunicator(0, 2), driver=FakeHipDriver())
    x = torch.zeros(100, 1024, dtype=torch.bfloat16)
    *_, h = op.dispatch(x, torch.zeros(100, 2), None, torch.zeros(100, 2, dtype=torch.int32), return_routing=True)
    op.combine(torch.zeros(200, 1024, dtype=torch.bfloat16), routing=h)
    print(json.dumps({{"module": EpDispatchCombineOp.__module__, "cls": [c.__module__ for c in EpDispatchCombineOp.__mro__],
                      "config": EpDispatchCombineConfig.__module__,
                      "jit_modules": sorted(m for m in sys.modules if m.split(".")[0] in ("flydsl", "mlir", "_mlir_libs"))}}))
""")


def test_a_server_importing_moris_ep_op_gets_ours_when_opted_in(tmp_path, smoke_store):
    """``from mori.ops.dispatch_combine_v2 import EpDispatchCombineOp`` with GEMMAR_AOT_PATCH_MORI=1 and
    the hook installed: gemmar-aot's op, taking mori's config as it is; without the variable, mori's."""
    import os

    from test_profiles import _fake_installed_mori, _installed

    site = tmp_path / "site"
    _fake_installed_mori(site, "amd-mori", "1.2.4", _installed("default").mori_dir, importable=True)
    pkg = site / "mori" / "ops" / "dispatch_combine_v2"
    pkg.mkdir(parents=True)
    (site / "mori" / "ops" / "__init__.py").write_text("")
    (pkg / "__init__.py").write_text(_FAKE_EP_INIT)
    pth_dir = tmp_path / "pth"
    pth_dir.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("GEMMAR_AOT_")}
    env["PYTHONPATH"] = os.pathsep.join((str(site), str(ROOT)))
    inst = subprocess.run([sys.executable, "-m", "gemmar_aot", "mori-patch", "install", "--site-dir", str(pth_dir)],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=120)
    assert inst.returncode == 0, inst.stderr
    code = _EP_SERVER.format(tests=str(ROOT / "tests"), pth_dir=str(pth_dir))
    env["GEMMAR_AOT_ARTIFACTS"] = str(smoke_store)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT,
                         env={**env, "GEMMAR_AOT_PATCH_MORI": "1"}, timeout=180)
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.splitlines()[-1])
    assert res["module"] == "mori.ops.dispatch_combine_v2" and "gemmar_aot.runtime.ep_op" in res["cls"]
    assert res["config"] == "mori.ops.dispatch_combine_v2" and res["jit_modules"] == []
    bound = [ln for ln in out.stderr.splitlines() if "gemmar-aot serves mori.ops.dispatch_combine_v2" in ln]
    assert len(bound) == 1 and "13 kernels" in bound[0] and "smoke.lock.json" in bound[0], out.stderr
    off = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=env,
                         timeout=180)
    assert off.returncode != 0 and "mori's JIT op was constructed" in off.stderr
