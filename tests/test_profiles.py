"""Toolchain profiles (build side) and the runtime's provenance rules (pod side).

Build side: the registry, the side-by-side layout (the default profile keeps the
layout of a toolchain set up before profiles existed), per-profile fingerprints,
keys that differ between profiles, FlyDSL's cache off in every profile.

Pod side: the installed mori must be the artifacts' mori (checked in a fresh
interpreter against a test double of an *installed* mori package: its
distribution metadata plus the device-ABI files, copied from the toolchain's
real unpacked wheel -- never mori's code), and one communicator never serves
two profiles.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import textwrap
from collections.abc import Mapping
from dataclasses import replace
from pathlib import Path

import pytest
from store_health import assert_verifies_clean

from gemmar_aot.model.device_abi import REQUIRED, DeviceAbiUnknown, device_abi_digest, device_abi_files
from gemmar_aot.util.errors import ToolchainError
from gemmar_aot.toolchain import compile_env, load_toolchain, toolchain_root
from gemmar_aot.toolchain.paths import Layout
from gemmar_aot.toolchain.profiles import DEFAULT_PROFILE, PROFILES, get_profile, resolve_profiles

ROOT = Path(__file__).resolve().parent.parent


def _installed(profile: str) -> Layout:
    lay = Layout(toolchain_root(), PROFILES[profile])
    if not lay.toolchain_json.is_file():
        pytest.skip(f"toolchain profile {profile!r} is not installed: run `make setup TOOLCHAIN={profile}`")
    return lay


# ---------------------------------------------------------------- registry and layout


def test_unknown_profile_names_the_profiles_and_the_fix():
    with pytest.raises(ToolchainError) as e:
        get_profile("bleeding")
    msg = str(e.value)
    assert "'bleeding'" in msg and all(name in msg for name in PROFILES) and "--toolchain" in msg


def test_profile_from_env_and_lists(monkeypatch):
    monkeypatch.setenv("GEMMAR_AOT_TOOLCHAIN_PROFILE", "nightly")
    assert get_profile().name == "nightly"
    monkeypatch.delenv("GEMMAR_AOT_TOOLCHAIN_PROFILE")
    assert get_profile().name == DEFAULT_PROFILE
    assert [p.name for p in resolve_profiles("all")] == list(PROFILES)
    assert [p.name for p in resolve_profiles("nightly,default,nightly")] == ["nightly", "default"]


def test_profiles_pin_different_moris_with_their_digests():
    default, nightly = PROFILES["default"], PROFILES["nightly"]
    assert (default.mori.project, default.mori.version) == ("amd-mori", "1.2.4")
    assert (nightly.mori.project, nightly.mori.version) == ("amd-mori-nightly", "1.2.5.dev20261026")
    for p in (default, nightly):
        assert len(p.mori.sha256) == 64 and p.mori.filename.startswith(
            f"{p.mori.project.replace('-', '_')}-{p.mori.version}-")


def test_default_profile_keeps_the_pre_profile_layout(tmp_path):
    """A toolchain set up before profiles existed is the default profile, path for path."""
    d = Layout(tmp_path)
    assert d.profile.name == DEFAULT_PROFILE
    assert d.toolchain_json == tmp_path / "toolchain.json"
    assert d.mori_dir == tmp_path / "mori-1.2.4"
    assert d.cco_bc == tmp_path / "cco" / "libmori_cco_device.bc"
    assert d.profile_stamps == d.stamps == tmp_path / "stamps"
    n = Layout(tmp_path, PROFILES["nightly"])
    assert n.toolchain_json == tmp_path / "profiles" / "nightly" / "toolchain.json"
    assert n.mori_dir == tmp_path / "profiles" / "nightly" / "mori-1.2.5.dev20261026"
    assert n.cco_bc.parent.parent == n.profile_dir != d.profile_dir
    # shared pieces are shared
    for attr in ("hip_dir", "resource_dir", "devicelib_dir", "ld_lld", "downloads", "stamps"):
        assert getattr(n, attr) == getattr(d, attr)


def test_flydsl_disk_cache_is_off_in_workers_of_every_profile():
    for name in PROFILES:
        lay = Layout(toolchain_root(), PROFILES[name])
        if not lay.toolchain_json.is_file():
            continue
        env = compile_env(load_toolchain(profile=name))
        assert env["FLYDSL_RUNTIME_ENABLE_CACHE"] == "0"
        assert env["MORI_CCO_BC"] == str(lay.cco_bc)


# ---------------------------------------------------------------- installed profiles


def test_nightly_profile_is_installed_side_by_side_with_its_own_bitcode():
    n, d = _installed("nightly"), _installed("default")
    tn, td = load_toolchain(profile="nightly"), load_toolchain(profile="default")
    assert tn.profile.name == "nightly" and tn.fingerprint["profile"] == "nightly"
    assert tn.fingerprint["mori"]["distribution"] == "amd-mori-nightly"
    assert tn.cco_bc == n.cco_bc and td.cco_bc == d.cco_bc
    assert tn.fingerprint["cco_bitcode"]["sha256"] != td.fingerprint["cco_bitcode"]["sha256"]
    # The nightly's device API adds symbols: its bitcode defines cco_local_ptr, 1.2.4's does not.
    assert b"cco_local_ptr" in n.cco_bc.read_bytes() and b"cco_local_ptr" not in d.cco_bc.read_bytes()
    assert tn.mori_identity()["device_abi_digest"] != td.mori_identity()["device_abi_digest"]


def test_keys_of_the_two_profiles_differ_in_the_mori_ingredients():
    _installed("nightly")
    from gemmar_aot.compiler.keys import diff_ingredients, flatten, toolchain_ingredients

    a = toolchain_ingredients(load_toolchain(profile="default").fingerprint)
    b = toolchain_ingredients(load_toolchain(profile="nightly").fingerprint)
    changed = {p for p, _, _ in diff_ingredients(a, b)}
    assert {"generator.mori_version", "generator.mori_sources_digest", "generator.mori_wheel_sha256",
            "generator.mori_distribution", "generator.mori_device_abi_digest",
            "toolchain.cco_bitcode_sha256"} <= changed
    assert not any(p.startswith("compiler.") for p in changed)
    assert not any("profile" in k for k in flatten(b))  # the name is a label, never an ingredient


def test_a_profile_directory_holding_another_profiles_fingerprint_is_refused(tmp_path):
    d = _installed("default")
    fake = Layout(tmp_path, PROFILES["nightly"])
    fake.profile_dir.mkdir(parents=True)
    shutil.copy2(d.toolchain_json, fake.toolchain_json)
    with pytest.raises(ToolchainError) as e:
        load_toolchain(tmp_path, profile="nightly")
    msg = str(e.value)
    assert "not profile 'nightly'" in msg and "make setup TOOLCHAIN=nightly" in msg


def test_missing_profile_says_how_to_install_it(tmp_path):
    with pytest.raises(ToolchainError, match=r"make setup TOOLCHAIN=nightly"):
        load_toolchain(tmp_path, profile="nightly")


# ---------------------------------------------------------------- device ABI


def test_device_abi_digest_covers_the_cco_sources_and_is_location_free(tmp_path):
    d = _installed("default")
    files = device_abi_files(d.mori_dir)
    assert set(REQUIRED) <= set(files)
    assert any(f.startswith("mori/cco/device/flydsl/") for f in files)
    for rel in files:
        (tmp_path / "copy" / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(d.mori_dir / rel, tmp_path / "copy" / rel)
    assert device_abi_digest(tmp_path / "copy") == device_abi_digest(d.mori_dir)
    hdr = tmp_path / "copy" / "mori" / "_jit-sources" / "include" / "mori" / "cco" / "cco.hpp"
    hdr.write_bytes(hdr.read_bytes() + b"\n// one more line\n")
    assert device_abi_digest(tmp_path / "copy") != device_abi_digest(d.mori_dir)
    hdr.unlink()
    with pytest.raises(DeviceAbiUnknown, match="cco.hpp"):
        device_abi_digest(tmp_path / "copy")


# ---------------------------------------------------------------- the pod's mori (fresh interpreter)


def _fake_installed_mori(site: Path, dist: str, version: str, abi_from: Path, *, tweak: bool = False,
                         importable: bool = False) -> None:
    """A test double of an installed mori: dist-info metadata and the device-ABI files only.
    Its ``__init__`` raises (unless ``importable``), so the runtime is shown never to import it."""
    for rel in device_abi_files(abi_from):
        dst = site / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(abi_from / rel, dst)
    (site / "mori" / "__init__.py").write_text(
        "" if importable else "raise ImportError('test double: mori must not be imported')\n")
    if tweak:  # another release: the cco header changed
        hdr = site / "mori" / "_jit-sources" / "include" / "mori" / "cco" / "cco.hpp"
        hdr.write_bytes(hdr.read_bytes() + b"\n// SDMA doorbell: top bit of the committed wptr\n")
    info = site / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "top_level.txt").write_text("mori\n")


_CONSTRUCT = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {tests!r})
    from fakes import FakeCommunicator, FakeHipDriver
    from gemmar_aot.runtime import GemmAllReduceOp, ArtifactMismatchError
    from gemmar_aot.model.lock import read_lock
    lock = read_lock({lock!r})
    try:
        op = GemmAllReduceOp(FakeCommunicator(), n=1024, k=256, m_max=512, artifacts={store!r},
                             driver=FakeHipDriver([lock]), self_test=False)
        print(json.dumps({{"ok": True, "m": list(op.m_values), "mori_imported": "mori.ops" in sys.modules}}))
        op.close()
    except ArtifactMismatchError as e:
        print(json.dumps({{"ok": False, "error": str(e)}}))
""")


def _construct_in_pod(smoke_store: Path, site: Path | None, lock_name: str = "smoke.lock.json", **env) -> dict:
    import os

    lock = str(smoke_store / "locks" / lock_name)
    code = _CONSTRUCT.format(tests=str(ROOT / "tests"), lock=lock, store=lock)
    e = {k: v for k, v in os.environ.items() if not k.startswith("GEMMAR_AOT_")}
    e["PYTHONPATH"] = os.pathsep.join(p for p in (str(site) if site else "", str(ROOT)) if p)
    e.update(env)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=e,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.splitlines()[-1])


def test_pod_with_the_artifacts_mori_is_served(smoke_store, tmp_path):
    d = _installed("default")
    _fake_installed_mori(tmp_path, "amd-mori", "1.2.4", d.mori_dir)
    res = _construct_in_pod(smoke_store, tmp_path)
    assert res["ok"] and res["m"] == [256, 512] and not res["mori_imported"]


def test_pod_without_mori_skips_the_check(smoke_store):
    res = _construct_in_pod(smoke_store, None)
    assert res["ok"], res


def test_pod_with_the_other_profiles_mori_is_refused_naming_both_and_the_fix(smoke_store, tmp_path):
    d = _installed("default")
    _fake_installed_mori(tmp_path, "amd-mori-nightly", "1.2.5.dev20261026", d.mori_dir, tweak=True)
    res = _construct_in_pod(smoke_store, tmp_path)
    assert not res["ok"]
    msg = res["error"]
    assert "amd-mori 1.2.4" in msg and "amd-mori-nightly 1.2.5.dev20261026" in msg
    assert "pip install amd-mori==1.2.4" in msg and "--toolchain" in msg
    assert "cco device ABIs differ" in msg and str(tmp_path) in msg


def test_same_version_with_another_device_abi_is_refused(smoke_store, tmp_path):
    d = _installed("default")
    _fake_installed_mori(tmp_path, "amd-mori", "1.2.4", d.mori_dir, tweak=True)
    res = _construct_in_pod(smoke_store, tmp_path)
    assert not res["ok"] and "cco device ABIs differ" in res["error"] and "versions differ" not in res["error"]


def test_the_check_can_be_switched_off_explicitly(smoke_store, tmp_path):
    d = _installed("default")
    _fake_installed_mori(tmp_path, "amd-mori-nightly", "1.2.5.dev20261026", d.mori_dir, tweak=True)
    assert _construct_in_pod(smoke_store, tmp_path, GEMMAR_AOT_MORI_CHECK="off")["ok"]


# ---------------------------------------------------------------- one profile per communicator


def _plain(v):
    return {k: _plain(x) for k, x in v.items()} if isinstance(v, Mapping) else v


def _relabelled(lock, profile: str, digest: str):
    """The same kernels under another profile's toolchain record (a double of a nightly lock)."""
    ingr = _plain(lock.toolchain.ingredients)
    ingr["generator"].update(mori_distribution="amd-mori-nightly", mori_version="1.2.5.dev20261026",
                             mori_device_abi_digest=digest)
    return replace(lock, toolchain=replace(lock.toolchain, ingredients=ingr, profile=profile))


def _only(lock, keep):
    return replace(lock, tuples=tuple(t for t in lock.tuples if keep(t.id)))


def test_one_communicator_never_serves_two_profiles(smoke_store, smoke_lock, monkeypatch):
    from fakes import FakeCommunicator, FakeHipDriver

    from gemmar_aot.runtime import ArtifactMismatchError, GemmAllReduceOp
    from gemmar_aot.runtime import provenance

    monkeypatch.setattr(provenance, "installed_mori", lambda: None)  # no mori in this "pod"
    if smoke_lock.toolchain.profile is None:
        pytest.skip("the smoke lock predates profiles")
    nightly = _relabelled(smoke_lock, "nightly", "f" * 64)
    comm, drv = FakeCommunicator(), FakeHipDriver([smoke_lock])
    kw = dict(n=1024, k=256, m_max=512, driver=drv, self_test=False)
    op1 = GemmAllReduceOp(comm, artifacts=(smoke_lock, smoke_store), **kw)
    with pytest.raises(ArtifactMismatchError, match="already serves ops built with amd-mori 1.2.4") as e:
        GemmAllReduceOp(comm, artifacts=(nightly, smoke_store), **kw)
    assert "SDMA" in str(e.value)
    assert comm.acquired["mem"] == 1  # refused before acquiring anything
    op_same = GemmAllReduceOp(comm, artifacts=(smoke_lock, smoke_store), **kw)  # same profile: fine
    other_comm = FakeCommunicator()
    op_other = GemmAllReduceOp(other_comm, artifacts=(nightly, smoke_store), **kw)  # another comm: fine
    op1.close()
    with pytest.raises(ArtifactMismatchError):
        GemmAllReduceOp(comm, artifacts=(nightly, smoke_store), **kw)  # op_same still holds it
    op_same.close()
    op2 = GemmAllReduceOp(comm, artifacts=(nightly, smoke_store), **kw)  # all closed: the comm is free
    for op in (op2, op_other):
        op.close()


def test_one_op_never_mixes_profiles(smoke_store, smoke_lock, monkeypatch):
    from fakes import FakeCommunicator, FakeHipDriver

    from gemmar_aot.runtime import ArtifactMismatchError, GemmAllReduceOp
    from gemmar_aot.runtime import provenance

    monkeypatch.setattr(provenance, "installed_mori", lambda: None)
    if smoke_lock.toolchain.profile is None:
        pytest.skip("the smoke lock predates profiles")
    a = _only(smoke_lock, lambda i: not (i.transport == "fused-sdma" and i.m == 512))
    b = _only(_relabelled(smoke_lock, "nightly", "e" * 64), lambda i: i.transport == "fused-sdma" and i.m == 512)
    with pytest.raises(ArtifactMismatchError, match="mix two toolchain profiles"):
        GemmAllReduceOp(FakeCommunicator(), n=1024, k=256, m_max=512, driver=FakeHipDriver([smoke_lock]),
                        self_test=False, artifacts=[(a, smoke_store), (b, smoke_store)])


def _two_profile_store(smoke_store, smoke_lock, tmp_path, monkeypatch) -> Path:
    """A copy of the smoke store with a double of a nightly lock beside its own (device ABI d...d),
    and no profile asked for in the environment."""
    from gemmar_aot.model.lock import write_lock

    if smoke_lock.toolchain.profile is None:
        pytest.skip("the smoke lock predates profiles")
    store = tmp_path / "store"
    shutil.copytree(smoke_store, store)
    write_lock(store / "locks" / "smoke.nightly.lock.json", _relabelled(smoke_lock, "nightly", "d" * 64))
    monkeypatch.delenv("GEMMAR_AOT_TOOLCHAIN_PROFILE", raising=False)
    return store


def test_a_store_with_two_profiles_serves_the_one_asked_for(smoke_store, smoke_lock, tmp_path, monkeypatch):
    from gemmar_aot.runtime import ArtifactNotFoundError, load_artifacts
    from gemmar_aot.runtime import provenance

    monkeypatch.setattr(provenance, "installed_mori", lambda: None)
    store = _two_profile_store(smoke_store, smoke_lock, tmp_path, monkeypatch)
    with pytest.raises(ArtifactNotFoundError, match="several toolchain profiles.*GEMMAR_AOT_TOOLCHAIN_PROFILE"):
        load_artifacts(store)
    monkeypatch.setenv("GEMMAR_AOT_TOOLCHAIN_PROFILE", "nightly")
    arts = load_artifacts(store)
    assert [s.lock_path.name for s in arts.sources] == ["smoke.nightly.lock.json"]
    monkeypatch.setenv("GEMMAR_AOT_TOOLCHAIN_PROFILE", "default")
    assert [s.lock_path.name for s in load_artifacts(store).sources] == ["smoke.lock.json"]


def test_a_mori_without_version_metadata_is_served_the_profile_its_device_abi_matches(smoke_store, smoke_lock,
                                                                                       tmp_path, monkeypatch):
    """Both profiles' locks in one store, no $GEMMAR_AOT_TOOLCHAIN_PROFILE, a mori whose version cannot be
    read: the profile whose device ABI it has is served (the installed-mori check accepts exactly that),
    and what cannot be told apart, or matches nothing, is said as it is."""
    from gemmar_aot.model.lock import write_lock
    from gemmar_aot.runtime import ArtifactNotFoundError, load_artifacts
    from gemmar_aot.runtime import provenance
    from gemmar_aot.runtime.provenance import InstalledMori, MoriIdentity

    store = _two_profile_store(smoke_store, smoke_lock, tmp_path, monkeypatch)

    def pod_with(version, abi, problem=""):
        inst = InstalledMori(MoriIdentity(None, version, abi), tmp_path / "site", problem)
        monkeypatch.setattr(provenance, "installed_mori", lambda: inst)

    pod_with(None, "d" * 64)  # the nightly's ABI, no metadata
    assert [s.lock_path.name for s in load_artifacts(store).sources] == ["smoke.nightly.lock.json"]
    default_abi = MoriIdentity.from_toolchain(smoke_lock.toolchain).device_abi_digest
    pod_with(None, default_abi)
    assert [s.lock_path.name for s in load_artifacts(store).sources] == ["smoke.lock.json"]
    pod_with(None, "f" * 64)  # neither
    with pytest.raises(ArtifactNotFoundError, match=r"is the mori of none of them \(default \(amd-mori 1.2.4(.|\n)*"
                                                    r"the cco device ABIs differ; nightly \((.|\n)*Fix: install"):
        load_artifacts(store)
    pod_with("1.2.5.dev20261026", None, "no mori/_jit-sources")  # its ABI unreadable: the version decides
    with pytest.raises(ArtifactNotFoundError, match=r"none of them(.|\n)*device ABI cannot be read \(no mori/_jit"):
        load_artifacts(store)
    both = _relabelled(smoke_lock, "nightly", default_abi)  # two profiles of one ABI, and no version to choose
    write_lock(store / "locks" / "smoke.nightly.lock.json", both)
    pod_with(None, default_abi)
    with pytest.raises(ArtifactNotFoundError, match=r"matches 2 of them equally(.|\n)*its version \(no distribution "
                                                    r"metadata\) cannot be read(.|\n)*GEMMAR_AOT_TOOLCHAIN_PROFILE="
                                                    r"(.|\n)*install mori with pip"):
        load_artifacts(store)


# ---------------------------------------------------------------- pods that change no code


_FAKE_GEMM_AR_INIT = textwrap.dedent("""
    # test double of mori.ops.gemm_ar's lazy __init__: eager helpers, the op module on first use
    import importlib
    def preshuffle_b(x):
        return ("mori's own preshuffle_b", x)
    _LAZY = {"GemmAllReduceOp": "op", "padded_m": "op"}
    def __getattr__(name):
        if name in _LAZY:
            return getattr(importlib.import_module("." + _LAZY[name], __name__), name)
        raise AttributeError(name)
""")

_SERVER = textwrap.dedent("""
    import json, sys
    sys.path.insert(0, {tests!r})
    import site
    site.addsitedir({pth_dir!r})        # processes the .pth as site-packages would at start-up
    from mori.ops.gemm_ar import GemmAllReduceOp, preshuffle_b   # what the server does
    from fakes import FakeCommunicator, FakeHipDriver
    from gemmar_aot.runtime import ArtifactMissingError
    from gemmar_aot.model.lock import read_lock
    import torch
    out = {{"module": GemmAllReduceOp.__module__, "cls": [c.__module__ for c in GemmAllReduceOp.__mro__],
            "preshuffle_b": preshuffle_b(1)[0]}}
    op = GemmAllReduceOp(FakeCommunicator(), n=1024, k=256, m_max=512, driver=FakeHipDriver([read_lock({lock!r})]),
                         self_test=False)
    fp8 = torch.float8_e4m3fn
    op(torch.zeros(512, 256, dtype=fp8), torch.zeros(1024, 256, dtype=fp8), torch.ones(2, 512), torch.ones(8, 2))
    try:  # M=256: these artifacts lack it
        op(torch.zeros(256, 256, dtype=fp8), torch.zeros(1024, 256, dtype=fp8), torch.ones(2, 256),
           torch.ones(8, 2))
        out["miss"] = "served"
    except ArtifactMissingError as e:
        out["miss"] = type(e).__name__
    out["jit_modules"] = sorted(m for m in sys.modules if m.split(".")[0] in ("flydsl", "mlir", "_mlir_libs")
                                or m == "mori.ops.gemm_ar.op")
    print(json.dumps(out))
""")


def _server(tmp_path: Path, smoke_store: Path, env_value: str | None):
    import os

    d = _installed("default")
    site = tmp_path / "site"
    _fake_installed_mori(site, "amd-mori", "1.2.4", d.mori_dir, importable=True)
    (site / "mori" / "ops").mkdir()
    (site / "mori" / "ops" / "__init__.py").write_text("")
    (site / "mori" / "ops" / "gemm_ar").mkdir()
    (site / "mori" / "ops" / "gemm_ar" / "__init__.py").write_text(_FAKE_GEMM_AR_INIT)
    (site / "mori" / "ops" / "gemm_ar" / "op.py").write_text(
        "raise ImportError('test double: mori\\'s JIT op was imported')\n")
    pth_dir = tmp_path / "pth"
    pth_dir.mkdir(parents=True)
    e = {k: v for k, v in os.environ.items() if not k.startswith("GEMMAR_AOT_")}
    e["PYTHONPATH"] = os.pathsep.join((str(site), str(ROOT)))
    inst = subprocess.run([sys.executable, "-m", "gemmar_aot", "mori-patch", "install", "--site-dir", str(pth_dir)],
                          capture_output=True, text=True, cwd=ROOT, env=e, timeout=120)
    assert inst.returncode == 0, inst.stderr
    # The smoke store without the bf16 fused-sdma M=256 tuple at K=256, so a strict miss can be shown.
    from gemmar_aot.model.lock import read_lock, write_lock

    store = tmp_path / "store"
    shutil.copytree(smoke_store, store)
    lock = store / "locks" / "smoke.lock.json"
    write_lock(lock, _only(read_lock(lock), lambda i: not (i.transport == "fused-sdma" and i.k == 256
                                                             and i.m == 256 and i.gather_dtype == "bf16")))
    e["GEMMAR_AOT_ARTIFACTS"] = str(lock)
    if env_value is not None:
        e["GEMMAR_AOT_PATCH_MORI"] = env_value
    code = _SERVER.format(tests=str(ROOT / "tests"), pth_dir=str(pth_dir), lock=str(lock))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, env=e,
                          timeout=180), lock


def test_server_importing_moris_op_gets_ours_when_opted_in(tmp_path, smoke_store):
    out, lock = _server(tmp_path, smoke_store, "1")
    assert out.returncode == 0, out.stderr
    res = json.loads(out.stdout.splitlines()[-1])
    assert res["module"] == "mori.ops.gemm_ar" and "gemmar_aot.runtime.op" in res["cls"]
    assert res["preshuffle_b"] == "mori's own preshuffle_b"  # every other name stays mori's
    assert res["miss"] == "ArtifactMissingError"  # strict: no JIT for an M without artifacts
    assert res["jit_modules"] == []  # neither FlyDSL nor mori's op module was imported
    bound = [ln for ln in out.stderr.splitlines() if "gemmar-aot serves mori.ops.gemm_ar.GemmAllReduceOp" in ln]
    assert len(bound) == 1 and str(lock) in bound[0] and "M [512]" in bound[0], out.stderr
    assert "amd-mori 1.2.4" in bound[0]


def test_without_the_opt_in_the_hook_changes_nothing(tmp_path, smoke_store):
    out, _lock = _server(tmp_path, smoke_store, None)
    assert out.returncode != 0 and "mori\'s JIT op was imported" in out.stderr, out.stderr
    out, _lock = _server(tmp_path / "zero", smoke_store, "0")
    assert out.returncode != 0 and "mori\'s JIT op was imported" in out.stderr


# ---------------------------------------------------------------- both profiles, one store (compile tier)


@pytest.fixture(scope="module")
def two_profile_store(smoke_store, tmp_path_factory):
    """The smoke store plus the smoke manifest built with the nightly profile into it."""
    _installed("nightly")
    from gemmar_aot.builder.pipeline import run_build

    store = tmp_path_factory.mktemp("two-profiles") / "store"
    shutil.copytree(smoke_store, store)
    # The default profile first (all hits when the smoke store was built by this checkout).
    run_build(ROOT / "manifests" / "smoke.toml", store=store, jobs=2, progress=False, toolchain_profile="default")
    summary = run_build(ROOT / "manifests" / "smoke.toml", store=store, jobs=2, progress=False,
                        toolchain_profile="nightly")
    return summary, store


@pytest.mark.compile
def test_smoke_manifest_builds_with_both_profiles_into_one_store(two_profile_store):
    from gemmar_aot.model.lock import read_lock

    summary, store = two_profile_store
    assert summary["failed"] == 0 and summary["toolchain_profile"] == "nightly"
    assert summary["compiled"] + summary["hits"] == summary["distinct_specs"]
    assert Path(summary["lock_file"]).name == "smoke.nightly.lock.json"
    default, nightly = (read_lock(store / "locks" / n) for n in ("smoke.lock.json", "smoke.nightly.lock.json"))
    assert not default.action_keys() & nightly.action_keys()  # no key is shared: the default's kernels stay
    assert nightly.toolchain.profile == "nightly" and default.toolchain.profile == "default"


@pytest.mark.compile
def test_profile_move_report_on_a_store_holding_both(two_profile_store):
    from gemmar_aot.builder.profile_move import format_report, profile_move

    summary, store = two_profile_store
    r = profile_move(ROOT / "manifests" / "smoke.toml", "nightly", frm="default", store=store)
    t = r["totals"]
    assert t["specs"] == t["keys_moved"] == t["in_store"] == summary["distinct_specs"] and t["to_compile"] == 0
    assert t["bytes_same"] + t["bytes_changed"] == t["specs"]
    assert "mori/ops/gemm_ar/kernels_fused.py" in r["mori_files"]["changed"]
    assert {w["ingredient"] for w in r["why"]} >= {"generator.mori_version", "toolchain.cco_bitcode_sha256"}
    text = format_report(r)
    assert "to compile" in text and "code objects differ" in text
    assert_verifies_clean(store)  # a store filled under two profiles


@pytest.mark.compile
def test_pod_refuses_nightly_artifacts_on_mori_1_2_4_and_serves_them_on_the_nightly(two_profile_store, tmp_path):
    _summary, store = two_profile_store
    d, n = _installed("default"), _installed("nightly")
    release = tmp_path / "release"
    _fake_installed_mori(release, "amd-mori", "1.2.4", d.mori_dir)
    res = _construct_in_pod(store, release, "smoke.nightly.lock.json")
    assert not res["ok"]
    assert "amd-mori-nightly 1.2.5.dev20261026" in res["error"] and "amd-mori 1.2.4" in res["error"]
    assert "pip install amd-mori-nightly==1.2.5.dev20261026" in res["error"]
    nightly = tmp_path / "nightly"
    _fake_installed_mori(nightly, "amd-mori-nightly", "1.2.5.dev20261026", n.mori_dir)
    assert _construct_in_pod(store, nightly, "smoke.nightly.lock.json")["ok"]
    # the release's artifacts on the nightly pod: refused the other way round
    res = _construct_in_pod(store, nightly, "smoke.lock.json")
    assert not res["ok"] and "pip install amd-mori==1.2.4" in res["error"]
