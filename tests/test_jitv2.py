"""mori's JIT v2 (EP v2's HIP backend, intranode and internode): planned by mori's own code, built ahead,
served to mori in a pod with no compiler.

The oracles are mori's own: its ``libmori_jit.so`` in a process of its own (``tests/jitv2_mori.py``),
compiling each plan with ROCm's hipcc as a test double on the toolchain's clang
(``tests/hipcc_shim.py``, written independently of ``gemmar_aot_kernels.jitv2``), or computing its key
and opening its cache in a pod gemmar-aot serves; mori's config and HIP backend, which decide the
plans; each code object's own metadata note. The HIP runtime is the test double ``tests/hipstub``.
``pytest -m parity -k jitv2`` selects the byte, key and pod proofs.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from dataclasses import replace
from pathlib import Path

import pytest

from gemmar_aot.builder.manifest import parse_manifest
from gemmar_aot.util.errors import ManifestError

ROOT = Path(__file__).resolve().parents[1]
TESTS = Path(__file__).resolve().parent
HEAD = '[manifest]\nname = "jv2"\narch = "gfx950"\n\n'
HIP_EP = ('[[ep]]\nkernel_backend = "hip"\nworld = 8\nhidden = 1024\nmax_tokens = 128\nexperts = 8\ntopk = 2\n'
          'dispatch_dtype = "bf16"\ndevice = "MI355X"\n')


def _errors(text: str) -> str:
    with pytest.raises(ManifestError) as e:
        parse_manifest(HEAD + text, "m.toml")
    return "\n".join(e.value.problems)


# ---------------------------------------------------------------- the manifest


def test_jitv2_entry_takes_moris_names_internode_and_nic_variants():
    m = parse_manifest(HEAD + HIP_EP.replace("world = 8", "world = 16\ngpu_per_node = 8").replace("experts = 8",
                                                                                                  "experts = 32")
                       + 'nics = ["mlx5", "ionic-ccqe"]\ninternode_kernel = "v2_ll"\n', "m.toml")
    assert m.eps == () and len(m.ep_hip) == 1
    e = m.ep_hip[0]
    assert e.internode and e.arch == "gfx950" and e.nics == ("mlx5", "ionic-ccqe") and e.topology[1] == 90500
    assert e.config() == {"rank": 0, "world_size": 16, "gpu_per_node": 8, "hidden_dim": 1024,
                          "max_num_inp_token_per_rank": 128, "num_experts_per_rank": 2, "num_experts_per_token": 2,
                          "data_type": "bf16", "scale_dim": 0, "scale_type_size": 0, "max_total_recv_tokens": 0,
                          "quant_type": "none", "combine_mode": "gather", "internode_kernel": "v2_ll",
                          "enable_std_moe": False}
    asym = parse_manifest(HEAD + HIP_EP.replace('"bf16"', '"fp8_e4m3fn"') + 'combine_dtype = "bf16"\n', "m.toml")
    assert (asym.ep_hip[0].config()["dispatch_data_type"], asym.ep_hip[0].config()["combine_data_type"]) == \
        ("fp8_e4m3fn", "bf16")
    assert parse_manifest(HEAD + HIP_EP.replace("MI355X", "MI300X"), "m.toml").ep_hip[0].arch == "gfx942"


def test_jitv2_entry_refuses_what_its_backend_has_not_and_points_internode_flydsl_at_it():
    assert "replay = true: mori's HIP backend has no routing replay" in _errors(HIP_EP + "replay = true\n")
    flydsl = HIP_EP.replace('kernel_backend = "hip"\n', "")
    assert 'nics = ["mlx5"]: only a HIP-backend entry takes it' in _errors(flydsl + 'nics = ["mlx5"]\n')
    assert 'set kernel_backend = "hip": multi-node EP runs mori\'s HIP backend' in _errors(
        flydsl.replace("world = 8", "world = 16\ngpu_per_node = 8"))
    assert "MI999X" in _errors(HIP_EP.replace("MI355X", "MI999X"))
    assert "nics" in _errors(HIP_EP + 'nics = ["infiniband"]\n')


@pytest.mark.compile
def test_jitv2_plan_is_what_moris_hip_backend_makes_and_its_refusals_are_moris_words():
    """The plan runs mori's own config and HIP backend: an intranode entry gets a dispatch and a combine
    (one geometry on an untuned shape), the plain internode family its six passes, every unit named
    as mori names it; a config mori refuses is a manifest error in mori's words, naming the entry."""
    from gemmar_aot.builder.plan import make_plan

    text = HEAD + HIP_EP + "\n" + HIP_EP.replace("world = 8", "world = 16\ngpu_per_node = 8").replace(
        "max_tokens = 128", "max_tokens = 64").replace("experts = 8", "experts = 32") + 'internode_kernel = "v2"\n'
    plan = make_plan(parse_manifest(text, "m.toml"))
    intra, inter = plan.jitv2
    assert sorted(u["plan"] for u in intra.units) == ["ep_combine", "ep_dispatch"]
    assert sorted(u["plan"] for u in inter.units) == sorted(
        ["ep_internode_copystaging", "ep_internode_dispatch", "ep_internode_combinesync",
         "ep_internode_combinesyncbarrier", "ep_internode_combine", "ep_internode_combineall"])
    for u in (*intra.units, *inter.units):
        assert u["cache_entry"].startswith(f"gfx950_mlx5/kernel.{u['plan']}.") and u["entry"] in u["text"]
        assert "--offload-arch=gfx950" in u["flags"] and "-DHIP_ENABLE_GFX950_OCP_BUILTINS=1" in u["flags"]
    assert {s.recipe for s in plan.specs} == {"jitv2"} and len(plan.specs) == 8
    with pytest.raises(ManifestError, match=r"m.toml:ep\[0\] \(line 5\): mori's HIP backend refuses this config on "
                                            r"MI355X \(NIC mlx5\): hip backend cannot serve this config: .*"
                                            r"combine_mode='scatter'"):
        make_plan(parse_manifest(HEAD + HIP_EP + 'combine_mode = "scatter"\n', "m.toml"))


# ---------------------------------------------------------------- mori's own JIT v2 as the oracle


def _jitv2_items(lock) -> dict:
    return {j.cache_entry: j for j in lock.jitv2}


def _requests(store: Path, items) -> list[dict]:
    """What mori's plan constructor is given for each item: the request the build recorded."""
    from gemmar_aot.store import Store

    st = Store(store, readonly=True)
    return [{"plan": j.plan, "request": st.read_record_named(j.entry.key, j.entry.record)["spec"]["params"]["request"]}
            for j in items]


def _mori(mode: str, req: dict, arch: str) -> dict:
    env = {**os.environ, "HIPSTUB_ARCH": arch, "PYTHONPATH": os.pathsep.join([str(ROOT), str(TESTS)])}
    p = subprocess.run([sys.executable, str(TESTS / "jitv2_mori.py"), mode, json.dumps(req)], capture_output=True,
                       text=True, cwd=ROOT, env=env, timeout=900)
    assert p.returncode == 0, p.stderr[-4000:]
    return json.loads(p.stdout.splitlines()[-1])


def _groups(lock) -> dict:
    out: dict = {}
    for j in lock.jitv2:
        out.setdefault((j.variant.arch, j.variant.nic), []).append(j)
    return out


@pytest.mark.parity
@pytest.mark.compile
def test_jitv2_bytes_equal_moris_own_jit_compiling_with_rocms_hipcc_as_a_double(smoke_store, smoke_lock, hipstub_lib,
                                                                                tmp_path):
    """Every smoke JIT v2 code object (both archs, intranode and internode) is byte for byte what mori's
    own libmori_jit makes of the same plan when its hipcc runs the same clang (paths and -cuid
    normalised by the hipcc double, nothing else)."""
    from gemmar_aot.toolchain import load_toolchain

    tc = load_toolchain()
    hipcc = tmp_path / "hipcc"
    hipcc.write_text(f"#!/bin/sh\nGEMMAR_AOT_TOOLCHAIN='{tc.root}' exec '{sys.executable}' '{TESTS / 'hipcc_shim.py'}' "
                     f"\"$@\"\n")
    hipcc.chmod(0o755)
    groups = _groups(smoke_lock)
    assert {k[0] for k in groups} == {"gfx950", "gfx942"} and sum(map(len, groups.values())) == 10
    for (arch, nic), items in sorted(groups.items()):
        got = _mori("compile", {"mori_dir": str(tc.mori_dir), "hip_lib": str(hipstub_lib.with_name("libamdhip64.so.7")),
                                "arch": arch, "nic": nic, "plans": _requests(smoke_store, items),
                                "cache": str(tmp_path / f"mori-{arch}-{nic}"), "hipcc": str(hipcc)}, arch)
        for item, made in zip(items, got["plans"]):
            assert "error" not in made, made
            assert made["sha256"] == item.entry.blob.hash, f"{item.describe()}: mori's own JIT made other bytes"


@pytest.mark.parity
@pytest.mark.compile
def test_jitv2_debian_hipcc_makes_every_smoke_jitv2_object_but_the_compilers_names(smoke_store, smoke_lock,
                                                                                  hipstub_lib, tmp_path):
    """mori's own libmori_jit with Debian's own ROCm hipcc (7.2.4, Debian clang 22.1.8: tests/debian_hipcc.py)
    as its hipcc makes every smoke JIT v2 object equal to ours in every ELF section but .comment."""
    from gemmar_aot.toolchain import debian_rocm, load_toolchain
    from test_debian_parity import elf_sections

    tc = load_toolchain()
    missing = debian_rocm.problems(tc.root) or ([debian_rocm.runner_problem()] if debian_rocm.runner_problem() else [])
    if missing:
        pytest.skip(f"Debian's ROCm oracle is not set up here ({'; '.join(missing)}): run `make setup`")
    hipcc = tmp_path / "hipcc"
    hipcc.write_text(f"#!/bin/sh\nexec '{sys.executable}' '{TESTS / 'debian_hipcc.py'}' \"$@\"\n")
    hipcc.chmod(0o755)
    for (arch, nic), items in sorted(_groups(smoke_lock).items()):
        got = _mori("compile", {"mori_dir": str(tc.mori_dir), "hip_lib": str(hipstub_lib.with_name("libamdhip64.so.7")),
                                "arch": arch, "nic": nic, "plans": _requests(smoke_store, items),
                                "cache": str(tmp_path / f"mori-{arch}-{nic}"), "hipcc": str(hipcc)}, arch)
        from gemmar_aot.store import Store

        st = Store(smoke_store, readonly=True)
        for item, made in zip(items, got["plans"]):
            assert "error" not in made, made
            theirs = elf_sections((tmp_path / f"mori-{arch}-{nic}" / made["cache_entry"] / "kernel.hsaco").read_bytes())
            ours = elf_sections(st.load_blob(item.entry.blob.hash, item.entry.blob.size))
            differ = sorted(n for n in set(ours) | set(theirs) if ours.get(n) != theirs.get(n))
            assert differ == [".comment"], f"{item.describe()}: sections differ: {differ}"


@pytest.mark.parity
@pytest.mark.parametrize("arch", ["gfx950", "gfx942"])
def test_jitv2_moris_key_in_a_pod_is_the_cache_entry_the_lock_names_and_nothing_compiles(smoke_store, smoke_lock,
                                                                                         hipstub_lib, tmp_path, arch):
    """In a pod with no ROCm (no ROCM_PATH, no hipcc) and gemmar-aot's hook, mori's own library computes
    each plan's key and opens the cache entry the lock names, and loads exactly the lock's bytes; a
    compile would have been refused, so none happened."""
    from gemmar_aot.toolchain import load_toolchain

    items = [j for j in smoke_lock.jitv2 if j.variant.arch == arch]
    assert items
    got = _mori("pod", {"mori_dir": str(load_toolchain().mori_dir), "arch": arch, "nic": "mlx5",
                        "hip_lib": str(hipstub_lib.with_name("libamdhip64.so.7")),
                        "plans": _requests(smoke_store, items), "artifacts": str(smoke_store),
                        "root": str(tmp_path / "mori-jit")}, arch)
    assert [(m.get("error"), m.get("cache_entry"), m.get("sha256")) for m in got["plans"]] == \
        [(None, j.cache_entry, j.entry.blob.hash) for j in items]
    hipcc = got["hipcc"]
    assert subprocess.run([hipcc, "--version"], capture_output=True, text=True).stdout.strip() == items[0].identity
    refused = subprocess.run([hipcc, "--genco", "kernel.hip"], capture_output=True, text=True)
    assert refused.returncode == 86 and "nothing is compiled in this pod" in refused.stderr
    assert not list((tmp_path / "mori-jit").glob("*/tmp/*"))


@pytest.mark.parity
def test_jitv2_pod_refuses_a_plan_the_artifacts_lack_naming_what_builds_it(smoke_store, smoke_lock, hipstub_lib,
                                                                           tmp_path):
    """A plan no artifact holds reaches gemmar-aot's hipcc in the pod, which compiles nothing: mori's
    constructor raises ArtifactMissingError naming the plan and what the artifacts hold."""
    from gemmar_aot.toolchain import load_toolchain

    item = next(j for j in smoke_lock.jitv2 if j.plan == "ep_combine" and j.variant.arch == "gfx950")
    plan = _requests(smoke_store, [item])[0]
    plan["request"] = {**plan["request"], "hiddenDim": 2048}
    got = _mori("pod", {"mori_dir": str(load_toolchain().mori_dir), "arch": "gfx950", "nic": "mlx5",
                        "hip_lib": str(hipstub_lib.with_name("libamdhip64.so.7")), "plans": [plan],
                        "artifacts": str(smoke_store), "root": str(tmp_path / "mori-jit")}, "gfx950")
    err = got["plans"][0]["error"]
    assert err.startswith("ArtifactMissingError: no prebuilt code object for mori's JIT v2 kernels of plan ep_combine")
    assert "nothing is compiled at run time" in err and "('gfx950', 'mlx5'," in err and "exit 86" in err


def test_jitv2_a_lock_item_bound_to_another_plans_record_is_refused(smoke_store, smoke_lock, tmp_path):
    """An edited lock whose dispatch item names the combine's kernel (key, blob, record) is refused at the
    pod's first request, naming what the record compiled; nothing is written for mori to load."""
    import shutil

    from gemmar_aot.model.lock import write_lock
    from gemmar_aot.model.jitv2 import JitV2Variant
    from gemmar_aot.runtime import ArtifactMismatchError
    from gemmar_aot.runtime.jitv2_server import JitV2Server

    store = tmp_path / "store"
    shutil.copytree(smoke_store, store)
    v = JitV2Variant("gfx950", "mlx5")
    disp = next(j for j in smoke_lock.jitv2 if j.variant == v and j.plan == "ep_dispatch")
    comb = next(j for j in smoke_lock.jitv2 if j.variant == v and j.plan == "ep_combine")
    edited = replace(smoke_lock, jitv2=tuple(replace(j, entry=comb.entry) if j is disp else j for j in smoke_lock.jitv2))
    write_lock(store / "locks" / "smoke.lock.json", edited)
    (store / "locks" / "smoke.records.zst").unlink(missing_ok=True)
    srv = JitV2Server(store, directory=tmp_path / "mori-jit")
    with pytest.raises(ArtifactMismatchError, match="the lock serves mori's JIT v2 ep_dispatch for gfx950, NIC mlx5 "
                                                    "with a record that compiled jitv2 ep_combine"):
        srv.prepare(v)
    assert not any((tmp_path / "mori-jit").glob("*/gfx950_mlx5"))


def test_jitv2_a_seeded_cache_holding_an_entry_no_lock_names_is_refused(smoke_store, tmp_path):
    """mori loads whatever it finds at its key: a file put into gemmar-aot's seeded cache that no lock item
    names is refused before mori can see it, and a seeded file changed on disk is written again."""
    from gemmar_aot.model.jitv2 import JitV2Variant
    from gemmar_aot.runtime import ArtifactMismatchError
    from gemmar_aot.runtime.jitv2_server import JitV2Server

    v = JitV2Variant("gfx950", "mlx5")
    srv = JitV2Server(smoke_store, directory=tmp_path / "root")
    env = srv.prepare(v)
    cache = Path(env["MORI_JIT_CACHE_DIR"])
    first = sorted(cache.glob("gfx950_mlx5/*/kernel.hsaco"))
    good = first[0].read_bytes()
    first[0].write_bytes(b"\x7fELF not what the lock names")
    assert JitV2Server(smoke_store, directory=tmp_path / "root").prepare(v) == env
    assert first[0].read_bytes() == good
    (cache / "gfx950_mlx5" / "kernel.ep_combine.000000000000000000000000").mkdir()
    (cache / "gfx950_mlx5" / "kernel.ep_combine.000000000000000000000000" / "kernel.hsaco").write_bytes(good)
    with pytest.raises(ArtifactMismatchError, match="holds entries no lock item names"):
        JitV2Server(smoke_store, directory=tmp_path / "root").prepare(v)


def test_jitv2_with_a_home_it_cannot_write_the_cache_goes_to_the_temp_directory_and_says_so(smoke_store, tmp_path,
                                                                                              monkeypatch, caplog):
    import logging
    import shutil
    import tempfile

    from gemmar_aot.model.jitv2 import JitV2Variant
    from gemmar_aot.runtime.jitv2_server import JitV2Server

    blocker = tmp_path / "not-a-directory"
    blocker.write_text("")
    monkeypatch.setenv("HOME", str(blocker / "home"))  # nothing can be made below a file, as root or not
    monkeypatch.delenv("XDG_CACHE_HOME", raising=False)
    monkeypatch.delenv("GEMMAR_AOT_MORI_JIT_DIR", raising=False)
    fallback = Path(tempfile.gettempdir()) / f"gemmar-aot-{os.getuid()}"
    try:
        with caplog.at_level(logging.WARNING, logger="gemmar_aot.runtime"):
            env = JitV2Server(smoke_store).prepare(JitV2Variant("gfx950", "mlx5"))
        assert Path(env["MORI_JIT_CACHE_DIR"]).parent == fallback / "mori-jit"
        assert f"is not writable; mori's JIT v2 cache goes to {fallback / 'mori-jit'}" in caplog.text
    finally:
        shutil.rmtree(fallback, ignore_errors=True)


def test_jitv2_the_manifest_lines_of_a_miss_build_it_and_suggest_collects_them(tmp_path):
    """The entry a pod writes for a HIP-backend config parses as the entry that builds it, and `suggest`
    turns a miss report's JIT v2 lines into those entries."""
    from types import SimpleNamespace

    from gemmar_aot.builder.suggest import suggest
    from gemmar_aot.runtime import ep_hip

    cfg = SimpleNamespace(world_size=16, gpu_per_node=8, hidden_dim=7168, max_num_inp_token_per_rank=4096,
                          num_experts_per_rank=16, num_experts_per_token=8, data_type="bf16", dispatch_data_type=None,
                          combine_data_type=None, scale_dim=0, scale_type_size=0, max_total_recv_tokens=0,
                          quant_type="none", internode_kernel="auto", num_qp_per_pe=2)

    class _Server:
        def variant(self):
            from gemmar_aot.model.jitv2 import JitV2Variant

            return JitV2Variant("gfx950", "ionic-ccqe")

    orig = ep_hip.jitv2_server._SERVER
    ep_hip.jitv2_server._SERVER = _Server()
    try:
        snippet = ep_hip.manifest_lines(cfg)
    finally:
        ep_hip.jitv2_server._SERVER = orig
    e = parse_manifest(HEAD + snippet, "m.toml").ep_hip[0]
    assert e.internode and e.nics == ("ionic-ccqe",) and e.config()["world_size"] == 16
    line = {"schema": 1, "op": "mori.jit.v2", "tuple": None, "jitv2": {"what": "x", "manifest_lines": snippet}}
    out = suggest([line, line])
    assert out["misses"] == 2 and out["snippet"] == snippet
